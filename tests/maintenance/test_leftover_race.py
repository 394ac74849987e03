"""Zero-grace maintenance never deletes a write in flight.

With window and orphan grace both 0 (both allowed), the temporary-file sweep (run by cleanup
without the store's lease) once deleted the temporary file of a commit in progress: the writer
failed with ``CannotCommit: ... No such file or directory``. A writer now holds a lock on its
temporary file until it is linked, and the sweep leaves a locked file alone at any age; a
killed writer's lock dies with it, and its leftover goes. Real writer processes race a real
sweep; ``now`` two hours ahead puts every file past the floor too, so only the lock protects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from state_runtime.maintenance import MaintenancePolicy, cleanup_pass, reconcile
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage, local
from tests.maintenance.streams import KEY, VALUE, StoreStream
from tests.maintenance.test_leftovers import REPO, A, leftovers, local_stream  # noqa: F401
from tests.maintenance.test_snapshots import fleet_on

ZERO = MaintenancePolicy(
    retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0)),
    min_window=timedelta(0),
)

# A real writer committing ``count`` versions of store 0/0/default after the given one;
# os.link waits ``pause`` seconds, and its ``hold``-th call (from 1; 0: none) prints "linking"
# and waits for a line on stdin, so that its fsynced temporary file sits there as a slow disk
# or a descheduled process would leave it.
WRITER = """
import json, os, sys, time
from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage

spec = json.loads(sys.argv[1])
link = os.link
links = 0

def slow_link(*args, **kwargs):
    global links
    links += 1
    if links == spec["hold"]:
        print("linking", flush=True)
        sys.stdin.readline()
    time.sleep(spec["pause"])
    return link(*args, **kwargs)

os.link = slow_link
provider = StateStoreProvider(LocalStorage(spec["root"]), 0, 0, "default",
                              key_schema=spec["key"], value_schema=spec["value"])
version, checkpoint_id = spec["version"], spec["checkpoint_id"]
for n in range(spec["count"]):
    store = provider.get_store(version, checkpoint_id)
    store.put((f"k{n}",), (n,))
    info = store.commit()
    version, checkpoint_id = info.version, info.checkpoint_id
print("committed", version, flush=True)
"""


def start_writer(
    stream: StoreStream, count: int, *, pause: float = 0.0, hold: int = 0
) -> subprocess.Popen[str]:
    latest = stream.committed[A][-1]
    spec = {
        "root": str(stream.storage.root),  # type: ignore[attr-defined]
        "version": latest.version,
        "checkpoint_id": latest.checkpoint_id,
        "count": count,
        "pause": pause,
        "hold": hold,
        "key": KEY,
        "value": VALUE,
    }
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, json.dumps(spec)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=2)


def test_a_paused_writers_temporary_file_survives_every_sweep(
    local_stream: StoreStream,  # noqa: F811
) -> None:
    writer = start_writer(local_stream, 1, hold=1)
    assert writer.stdout is not None and writer.stdin is not None
    try:
        assert writer.stdout.readline().strip() == "linking", writer.stderr
        (left,) = leftovers(local_stream.storage)
        assert left.live
        temporary = local_stream.storage.root / left.path  # type: ignore[attr-defined]
        old = time.time() - 3 * 3600  # older than any grace and the floor: only the lock
        os.utime(temporary, (old, old))
        where = f"{local_stream.root}/{left.path}"
        fleet = fleet_on(local_stream)
        cleaned = cleanup_pass(fleet, ZERO, dry_run=False, now=later())
        assert cleaned.leftovers.young == [where] and not cleaned.leftovers.removed
        swept = reconcile(fleet, ZERO, now=later(), min_age=timedelta(0), dry_run=True)
        assert swept.leftovers.young == [where] and not swept.leftovers.removed
        assert temporary.exists()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err
    assert out.split() == ["committed", "3"]
    assert not temporary.exists() and leftovers(local_stream.storage) == []
    store = local_stream.provider(A).get_store(3)  # loads from its files, a fresh process's way
    assert store.get(("k0",)) == (0,)


def test_a_killed_writers_lock_dies_with_it(local_stream: StoreStream) -> None:  # noqa: F811
    writer = start_writer(local_stream, 1, hold=1)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "linking"
    writer.kill()
    writer.wait()
    (left,) = leftovers(local_stream.storage)
    assert not left.live
    fleet = fleet_on(local_stream)
    young = cleanup_pass(fleet, ZERO, dry_run=False)  # zero grace, but under the floor
    assert len(young.leftovers.young) == 1 and len(leftovers(local_stream.storage)) == 1
    done = cleanup_pass(fleet, ZERO, dry_run=False, now=later())
    assert done.leftovers.removed == [f"{local_stream.root}/{left.path}"]
    assert leftovers(local_stream.storage) == []
    for stream in (writer.stdout, writer.stderr, writer.stdin):
        if stream is not None:
            stream.close()


def test_a_writer_racing_zero_grace_sweeps_commits_every_version(
    local_stream: StoreStream,  # noqa: F811
) -> None:
    """Sweeps race a writer's commits; at its middle commit the writer holds its link until
    a sweep has met the write in flight (and left it), so the race is run however the
    machine's load schedules the two processes, then the writer races on."""
    count = 40
    writer = start_writer(local_stream, count, pause=0.02, hold=count // 2)
    assert writer.stdout is not None and writer.stdin is not None
    held = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in writer.stdout:  # type: ignore[union-attr]
            lines.append(line)
            held.set()  # the first line is "linking"

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    fleet = fleet_on(local_stream)
    seen_live = sweeps = 0
    try:
        while writer.poll() is None:
            holding = held.is_set() and not writer.stdin.closed
            report = cleanup_pass(fleet, ZERO, dry_run=False, now=later())
            seen_live += len(report.leftovers.young)
            sweeps += 1
            assert not report.leftovers.failed
            if holding:  # this sweep ran while the writer held its link
                assert report.leftovers.young, "a sweep missed the write held in flight"
                writer.stdin.write("go\n")
                writer.stdin.close()
        writer.wait(timeout=60)
        reader.join(timeout=60)
        err = writer.stderr.read() if writer.stderr is not None else ""
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err
    assert writer.stdin.closed, "the writer ended without holding its link"
    assert "".join(lines).split() == ["linking", "committed", str(2 + count)]
    assert seen_live > 0, f"{sweeps} sweeps never met a write in flight: no race was run"
    store = local_stream.provider(A).get_store(2 + count)
    assert [store.get((f"k{n}",)) for n in range(count)] == [(n,) for n in range(count)]


def test_a_sweep_between_creating_and_locking_a_temporary_file_costs_the_writer_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one instant the lock cannot cover, forced: right after the writer creates its
    temporary file, before it locks it, a real sweep takes the lock and removes the file.
    The writer sees its name gone once it holds the lock and starts over with a new file
    (before, it wrote and fsynced into the removed file and failed at the link)."""
    storage = LocalStorage(tmp_path / "root")
    create = tempfile.mkstemp
    swept: list[str] = []

    def create_then_sweep(**kwargs: Any) -> tuple[int, str]:
        fd, name = create(**kwargs)
        if not swept:  # the first file only: the writer's second one is left alone
            path = Path(name).relative_to(storage.root).as_posix()
            (unlocked,) = storage.partial_writes([str(Path(path).parent)])
            assert not unlocked.live
            swept.extend(storage.abort_partial_writes([unlocked]).deleted)
        return fd, name

    monkeypatch.setattr(local.tempfile, "mkstemp", create_then_sweep)
    storage.write_if_absent("state/0/0/default/1.delta", b"committed bytes")
    assert len(swept) == 1 and not (storage.root / swept[0]).exists()
    assert storage.read("state/0/0/default/1.delta") == b"committed bytes"
    assert list(storage.partial_writes(["state/0/0/default"])) == []
