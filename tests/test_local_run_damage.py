"""A run file on local disk damaged under a cached version: truncated or deleted for real,
then met by a batch lookup, a point lookup or a scan. Each time a typed, retryable error names
the store and the file, the worker drops the versions holding it, and opening the store again
(what Spark's retry of the task does, in the same worker) loads it from storage: equal to what
was committed, and it commits on (docs/state-on-disk.md, "A damaged run file"). A cached
version whose files are damaged before a task asks for it is not served at all: through the
real task body and catalog, the next batch loads from storage and commits, to the same state
as a query whose files were never damaged."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from state_runtime import StateStoreProvider
from state_runtime.errors import LocalRunDamaged
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun
from state_runtime.store.run_levels import parts
from state_runtime.store.state_store import StateStore
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


def _files(store: StateStore) -> list[str]:
    return [p.path for run in store._runs() for p in parts(run) if isinstance(p, DiskRun)]


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("meets", MEETS)
def test_a_damaged_run_file_fails_typed_and_a_retry_loads_from_storage(
    tmp_path: Path, damage: str, meets: str
) -> None:
    provider = StateStoreProvider(
        LocalStorage(str(tmp_path / "root")), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    with forced_disk():
        store = provider.get_store(0)
        store.apply([(k, k) for k in KEYS])
        info = store.commit()
        store = provider.get_store(info.version, info.checkpoint_id)
        store.apply([(k, -k) for k in KEYS[::3]])
        info = store.commit()
        expected = {k: -k if k % 3 == 0 else k for k in KEYS}

        cached = provider.get_store(info.version, info.checkpoint_id)
        assert cached.metrics.load.source == LoadSource.CACHE
        files = _files(cached)
        assert files
        for path in files:
            DAMAGE[damage](path)
        with pytest.raises(LocalRunDamaged) as raised:
            MEETS[meets](cached)
        error = raised.value
        assert error.retryable and error.code == "STATE_LOCAL_RUN_DAMAGED"
        assert error.path in files and error.store is not None
        assert f"store={error.store}" in str(error) and f"file={error.path}" in str(error)
        cached.abort()

        again = provider.get_store(info.version, info.checkpoint_id)
        # from storage: version 2's delta read, on an undamaged cached ancestor or on nothing
        assert again.metrics.load.source != LoadSource.CACHE
        assert again.metrics.load.deltas_applied >= 1
        assert not LOCAL_DISK.damaged & set(_files(again))
        assert {k[0]: v[0] for k, v in again.items()} == expected
        assert again.get(7) == (7,) and again.get(9) == (-9,)
        again.apply([(1000, 1)])
        after = again.commit()
        reread = provider.get_read_store(after.version, after.checkpoint_id)
        assert {k[0]: v[0] for k, v in reread.items()} == expected | {1000: 1}
    assert not LOCAL_DISK.damaged & set(_files(again))


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
