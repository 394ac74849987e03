"""A cold load racing the stream, a snapshotter and the store-level cleanup must not fail.

Real threads on real files, running freely: a writer commits 120 versions; a snapshotter
snapshots the latest committed version again and again; the cleanup (zero age window) deletes
what the retained versions no longer need as soon as it can; three readers open fresh
providers on the retained versions (the latest two). The writer commits each version only
after a snapshot, a cleanup and a read since the last one, so the race runs as long on a
loaded machine as on an idle one. The readers' disk is slow (each read
waits a little), which widens the window between listing a folder and reading what it listed.
Every cold read must succeed on its first call and return exactly the model's state.

What "retained" means is the cleanup's rule: the two newest committed versions it is told
of. A version being read is pinned, and the cleanup waits while a pinned version would fall
out of that window, as an engine keeps a version it is reading. With a zero age window the
cleanup would take a delta committed after it listed for an orphan, so (standing in for the
window) it does not overlap the writer's commits; it does overlap the readers and the
snapshotter.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path

import pytest

from state_runtime import CheckpointInfo
from state_runtime.storage import LocalStorage
from state_runtime.storage.base import ByteStream
from state_runtime.store.file_cleanup import cleanup
from tests.gates import Gates

from .store_helpers import commit_rows, provider_for, state_of

VERSIONS = 120


class SlowLocalStorage(LocalStorage):
    """Local files read after a short wait: a slow disk."""

    def read(self, path: str) -> bytes:
        time.sleep(0.005)
        return super().read(path)

    def read_stream(self, path: str) -> AbstractContextManager[ByteStream]:
        time.sleep(0.005)  # how checkpoint files are read
        return super().read_stream(path)


class Pins:
    """Committed versions (with their model) and the versions being read."""

    def __init__(self, first: CheckpointInfo, model: dict[str, int]) -> None:
        self.lock = threading.Lock()
        self.committed = [(first, model)]
        self.reading: Counter[int] = Counter()

    def pin(self, back: int) -> tuple[CheckpointInfo, dict[str, int]]:
        with self.lock:
            info, model = self.committed[max(0, len(self.committed) - 1 - back)]
            self.reading[info.version] += 1
            return info, model

    def unpin(self, info: CheckpointInfo) -> None:
        with self.lock:
            self.reading[info.version] -= 1
            if not self.reading[info.version]:
                del self.reading[info.version]


def test_cold_readers_of_retained_versions_load_while_maintenance_runs(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "checkpoint")
    slow = SlowLocalStorage(tmp_path / "checkpoint")
    writer = provider_for(storage, min_deltas_for_snapshot=3)
    first = commit_rows(writer, None, {"k0": 0})
    pins = Pins(first, {"k0": 0})
    done = threading.Event()
    failures: list[BaseException] = []
    counts: Counter[str] = Counter()

    gates = Gates("snapshots", "cleanups", "reads")

    def loop(body: object) -> None:
        try:
            while not done.is_set():
                body()  # type: ignore[operator]
        except BaseException as e:
            failures.append(e)
            done.set()

    def made(what: str) -> None:
        counts[what] += 1
        gates.made(what)

    def snapshot() -> None:
        info, _ = pins.pin(0)
        try:
            provider_for(storage, min_deltas_for_snapshot=3).snapshot(
                info.version, info.checkpoint_id
            )
            made("snapshots")
        finally:
            pins.unpin(info)

    def clean() -> None:
        cleaner = provider_for(storage, min_deltas_for_snapshot=3)
        with pins.lock:  # no commit and no new pin below the retained window meanwhile
            latest = pins.committed[-1][0]
            if not pins.reading or min(pins.reading) >= latest.version - 1:
                report = cleanup(cleaner, latest.ref, min_age=timedelta(0), dry_run=False)
                assert not report.failed, report.failed
                counts["deleted"] += len(report.deleted)
                made("cleanups")
        time.sleep(0.002)

    def cold_read(back: int) -> None:
        info, model = pins.pin(back)
        try:
            store = provider_for(slow, min_deltas_for_snapshot=3).get_read_store(
                info.version, info.checkpoint_id
            )  # the first try must succeed
            assert {k[0]: v[0] for k, v in store.items()} == model, info.ref
            made("reads")
            counts["relisted"] += sum(
                "listed the files again" in r for r in store.metrics.load.repairs
            )
        finally:
            pins.unpin(info)

    threads = [
        threading.Thread(target=loop, args=(body,))
        for body in (
            snapshot,
            clean,
            lambda: cold_read(0),
            lambda: cold_read(1),
            lambda: cold_read(0),
        )
    ]
    for t in threads:
        t.start()
    info, model = first, {"k0": 0}
    try:
        for v in range(2, VERSIONS + 1):
            # Each commit waits for a snapshot, a cleanup and a read since the last one, so
            # the race is run however loaded the machine is (the threads keep running freely).
            if not gates.passed(done):
                break
            puts = {f"k{v}": v, f"k{v % 7}": -v}
            with pins.lock:
                info = commit_rows(writer, info, puts, removes=(f"k{v - 3}",))
                model = {k: x for k, x in model.items() if k != f"k{v - 3}"} | puts
                pins.committed.append((info, model))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=120)
    assert not failures, repr(failures[0])
    assert info.version == VERSIONS
    assert min(counts["reads"], counts["snapshots"], counts["cleanups"]) >= VERSIONS - 1
    assert counts["deleted"] > VERSIONS // 2  # the cleanup really removed superseded files
    # Nothing a retained version needs was deleted: both load from files alone.
    last, before = pins.committed[-1], pins.committed[-2]
    assert state_of(provider_for(storage), last[0]) == last[1]
    assert state_of(provider_for(storage), before[0]) == before[1]
    print(dict(counts))


def test_a_listing_that_missed_the_snapshot_replacing_the_delta_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI hit once in the test above, replayed: a local listing reads the folder's
    names, then each file's size. Between the two, maintenance snapshots the version and
    deletes its delta, so the listing holds neither file. The load lists again."""
    storage = LocalStorage(tmp_path / "checkpoint")
    writer = provider_for(storage, min_deltas_for_snapshot=100)
    info = commit_rows(writer, None, {"k0": 0})
    for v in range(1, 4):
        info = commit_rows(writer, info, {f"k{v}": v})
    folder = str(tmp_path / "checkpoint" / writer.store_id.directory)
    delta = Path(folder) / f"{info.ref}.delta"
    real_scandir = os.scandir
    armed = [True]

    def names_then_maintenance(path: str) -> Iterator[os.DirEntry[str]]:
        entries = list(real_scandir(path))
        if armed[0] and os.path.samefile(path, folder):
            armed[0] = False  # maintenance lists the folder too, untouched
            provider_for(storage).snapshot(info.version, info.checkpoint_id)
            report = cleanup(provider_for(storage), info.ref, min_age=timedelta(0), dry_run=False)
            assert not report.failed, report.failed
            assert not delta.exists()
        return iter(entries)

    monkeypatch.setattr(os, "scandir", names_then_maintenance)
    store = provider_for(storage).get_read_store(info.version, info.checkpoint_id)
    assert not armed[0], "the race was not run"
    assert {k[0]: v[0] for k, v in store.items()} == {f"k{v}": v for v in range(4)}
    assert any("listed the files again" in r for r in store.metrics.load.repairs)
