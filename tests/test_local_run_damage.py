"""A run file on local disk damaged under a cached version: truncated or deleted for real,
then met by a batch lookup, a point lookup or a scan. Each time a typed, retryable error names
the store and the file, the worker drops the versions holding it, and opening the store again
(what Spark's retry of the task does, in the same worker) loads it from storage: equal to what
was committed, and it commits on (docs/state-on-disk.md, "A damaged run file"). A cached
version whose files are damaged before a task asks for it is not served at all: through the
real task body and catalog, the next batch loads from storage and commits, to the same state
as a query whose files were never damaged."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from state_runtime import StateStoreProvider
from state_runtime.errors import LocalRunDamaged, StoreClosed
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.disk_runs import BLOCKS, LOCAL_DISK, DiskRun
from state_runtime.store.open_runs import OPEN_RUNS
from state_runtime.store.run_levels import parts
from state_runtime.store.state_store import ReadStateStore, StateStore
from state_runtime.store.store_metrics import LoadSource
from tests.simulation.platform import Platform
from tests.store_helpers import forced_disk

KEYS = range(0, 400)


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


DAMAGE: dict[str, Callable[[str], None]] = {"truncated": _truncate, "deleted": os.unlink}


def _batch_lookup(store: StateStore) -> object:
    keys = pa.StructArray.from_arrays([pa.array(list(KEYS), pa.int64())], names=["k"])
    return store.lookup(keys)


MEETS: dict[str, Callable[[StateStore], object]] = {
    "batch lookup": _batch_lookup,
    "get": lambda store: store.get(7),
    "scan": lambda store: list(store.items()),
}


def _files(store: StateStore | ReadStateStore) -> list[str]:
    return [p.path for run in store._runs() for p in parts(run) if isinstance(p, DiskRun)]


def _version_one(tmp_path: Path) -> tuple[StateStoreProvider, CheckpointInfo]:
    """A provider whose store committed every key of KEYS (k -> k) as version 1, and that
    commit (call under ``forced_disk``: every run on local disk)."""
    provider = StateStoreProvider(
        LocalStorage(str(tmp_path / "root")), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    store = provider.get_store(0)
    store.apply([(k, k) for k in KEYS])
    return provider, store.commit()


def _damage(paths: list[str], how: Callable[[str], None]) -> None:
    """Damage each file with no copy left in the process: its blocks and readers dropped."""
    for path in paths:
        BLOCKS.drop(path)
        OPEN_RUNS.close(path)
        how(path)


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("meets", MEETS)
def test_a_damaged_run_file_fails_typed_and_a_retry_loads_from_storage(
    tmp_path: Path, damage: str, meets: str
) -> None:
    with forced_disk():
        provider, first = _version_one(tmp_path)
        store = provider.get_store(first.version, first.checkpoint_id)
        store.apply([(k, -k) for k in KEYS[::10]])  # under a quarter: on version 1's base
        info = store.commit()
        expected = {k: -k if k % 10 == 0 else k for k in KEYS}

        cached = provider.get_store(info.version, info.checkpoint_id)
        assert cached.metrics.load.source == LoadSource.CACHE
        files = _files(cached)
        assert set(files) & set(_files(provider.get_read_store(first.version, first.checkpoint_id)))
        _damage(files, DAMAGE[damage])
        with pytest.raises(LocalRunDamaged) as raised:
            MEETS[meets](cached)
        error = raised.value
        assert error.retryable and error.code == "STATE_LOCAL_RUN_DAMAGED"
        assert error.path in files and error.store is not None
        assert f"store={error.store}" in str(error) and f"file={error.path}" in str(error)
        cached.abort()
        del cached, store, raised, error

        again = provider.get_store(info.version, info.checkpoint_id)
        # from storage: version 2's delta read, on an undamaged cached ancestor or on nothing
        assert again.metrics.load.source != LoadSource.CACHE
        assert again.metrics.load.deltas_applied >= 1
        assert {k[0]: v[0] for k, v in again.items()} == expected
        assert again.get(7) == (7,) and again.get(20) == (-20,)
        again.apply([(1000, 1)])
        after = again.commit()
        reread = provider.get_read_store(after.version, after.checkpoint_id)
        assert {k[0]: v[0] for k, v in reread.items()} == expected | {1000: 1}
    gc.collect()  # the damaged runs' last holders gone: their files queued,
    LOCAL_DISK.sweep()  # then deleted and forgotten
    assert not LOCAL_DISK.damaged & set(files)
    assert not any(os.path.exists(path) for path in files)


def test_a_commit_meeting_a_damaged_run_file_aborts_its_store(tmp_path: Path) -> None:
    """The commit counts its rows by looking its changed keys up in the version: a damaged
    run file met there fails the commit typed, the store is aborted (no later call on it),
    and nothing is made visible: the next version is the retry's."""
    with forced_disk():
        provider, info = _version_one(tmp_path)
        store = provider.get_store(info.version, info.checkpoint_id)
        store.apply([(k, -k) for k in KEYS[::7]])
        _damage(_files(store), _truncate)
        with pytest.raises(LocalRunDamaged):
            store.commit()
        with pytest.raises(StoreClosed):
            store.commit()
        retry = provider.get_store(info.version, info.checkpoint_id)
        retry.apply([(k, -k) for k in KEYS[::7]])
        done = retry.commit()
        read = provider.get_read_store(done.version, done.checkpoint_id)
        assert {k[0]: v[0] for k, v in read.items()} == {k: -k if k % 7 == 0 else k for k in KEYS}
        assert done.version == 2 and len(list((tmp_path / "root").rglob("2_*.delta"))) == 1


MAPPED_THEN_TRUNCATED = """
import os
import pyarrow as pa
from state_runtime import StateStoreProvider
from state_runtime.errors import LocalRunDamaged
from state_runtime.storage import LocalStorage
from state_runtime.store.disk_runs import DiskRun
from state_runtime.store.run_levels import parts
from tests.store_helpers import forced_disk

with forced_disk():
    provider = StateStoreProvider(
        LocalStorage(os.environ["ROOT"]), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    store = provider.get_store(0)
    store.apply([(k, k) for k in range(4000)])
    store = provider.get_store(1, store.commit().checkpoint_id)
    keys = pa.StructArray.from_arrays([pa.array(range(0, 4000, 3), pa.int64())], names=["k"])
    store.lookup(keys)  # maps the run's file, kept mapped for the next lookup
    for run in store._runs():
        for part in parts(run):
            if isinstance(part, DiskRun):
                os.truncate(part.path, part.file_bytes // 4)
    try:
        store.lookup(keys)
    except LocalRunDamaged as e:
        print(e.code)
"""


def test_a_run_file_truncated_under_its_map_fails_typed_not_with_sigbus(tmp_path: Path) -> None:
    """A batch lookup maps a run file and keeps the map; the file is then truncated to a
    quarter, and the next lookup through the same map fails typed (its length is checked
    before a page is touched): reading a page past the new end would kill the process with
    SIGBUS, so the check runs in a process of its own."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", MAPPED_THEN_TRUNCATED],
        capture_output=True,
        text=True,
        env=os.environ | {"ROOT": str(tmp_path / "root"), "PYTHONPATH": str(repo)},
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "STATE_LOCAL_RUN_DAMAGED"), done


def _batches(platform: Platform, count: int) -> None:
    for batch in range(count):
        platform.run_batch(batch, {p: {k: batch + p + 1 for k in "abcd"} for p in range(2)})


def test_a_batch_after_its_run_files_were_damaged_loads_from_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two queries through the real task body (the simulation's platform, no Spark), every
    run on local disk; one's local run files (``forced_disk``) are truncated after two
    batches. The worker's cache finds each cached version's files short before serving it, so
    the third batch's tasks load from storage and commit at once, and every store's versions
    load equal to the undamaged query's."""
    saved = CACHE.budget
    monkeypatch.setenv("STATE_CACHE_BYTES", str(256 << 10))  # the tasks' budget (cached)
    LOCAL_DISK.set_directory(str(tmp_path / "local"))
    for name in ("damaged", "clean"):
        (tmp_path / name).mkdir()
    damaged, clean = Platform(tmp_path / "damaged"), Platform(tmp_path / "clean")
    try:
        with forced_disk():
            _batches(damaged, 2)
            files = [str(f) for f in (tmp_path / "local").rglob("*.arrow")]
            assert files
            for path in files:
                _truncate(path)
            reports = damaged.run_batch(2, {p: {"a": 5} for p in range(2)})
            assert {r.load_source for r in reports} == {LoadSource.FILES.value}
            _batches(clean, 2)
            clean.run_batch(2, {p: {"a": 5} for p in range(2)})
            committed, expected = damaged.committed_refs(), clean.committed_refs()
            assert sorted(committed) == sorted(expected) == [0, 1, 2]
            for batch in committed:
                for store, ref in committed[batch].items():
                    assert damaged.load(store, ref) == clean.load(store, expected[batch][store])
    finally:
        damaged.close()
        clean.close()
        set_budget(saved)
        LOCAL_DISK.set_directory(None)
