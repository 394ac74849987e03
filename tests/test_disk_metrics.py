"""A store's figures of state on local disk (``StoreMetrics.disk``) against what is really
there: the bytes of its run files, the bytes it holds in memory, the block cache's hits on a
re-read and the bytes a compaction wrote, in memory and on disk."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun
from state_runtime.store.state_store import StateStore
from state_runtime.store.store_metrics import LoadSource
from tests.store_helpers import int_table

KEYS = 3000


@pytest.fixture
def local_dir(tmp_path: Path) -> Iterator[Path]:
    """The runs written in the test go to a folder of its own."""
    folder = tmp_path / "local"
    LOCAL_DISK.set_directory(str(folder))
    try:
        yield folder
    finally:
        LOCAL_DISK.set_directory(None)


@pytest.fixture
def small_budget() -> Iterator[None]:
    """A 256 KiB budget: runs past 64 KiB go to disk in 1 KiB blocks, and the block cache
    holds 64 KiB of them (the real spill rule, not the forced one)."""
    saved = CACHE.budget, LOCAL_DISK.block_bytes
    set_budget(256 << 10)
    LOCAL_DISK.block_bytes = 1024
    try:
        yield
    finally:
        set_budget(saved[0])
        LOCAL_DISK.block_bytes = saved[1]


def _provider(tmp_path: Path) -> StateStoreProvider:
    storage = LocalStorage(str(tmp_path / "root"))
    return StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")


def _commits(provider: StateStoreProvider, batches: list[range]) -> StateStore:
    """One commit per range of keys (put k -> k); the last store, committed."""
    store = provider.get_store(0)
    for keys in batches:
        store.apply([(k, k) for k in keys])
        info = store.commit()
        if keys is not batches[-1]:
            store = provider.get_store(info.version, info.checkpoint_id)
    return store


def test_a_commit_reports_the_bytes_its_runs_hold(
    tmp_path: Path, local_dir: Path, state_mode: str
) -> None:
    store = _commits(_provider(tmp_path), [range(0, KEYS), range(KEYS, KEYS + 100)])
    disk = store.metrics.disk
    runs = store._runs()
    on_disk = [run for run in runs if isinstance(run, DiskRun)]
    assert disk.resident_bytes == sum(run.nbytes for run in runs) > 0
    if state_mode == "memory":
        assert not on_disk and disk.local_disk_bytes == 0
        return
    assert on_disk and all(Path(run.path).parent == Path(LOCAL_DISK.directory) for run in on_disk)
    assert disk.local_disk_bytes == sum(os.path.getsize(run.path) for run in on_disk)
    # every file in the folder is one of this store's cached versions' runs
    assert disk.local_disk_bytes <= sum(p.stat().st_size for p in local_dir.rglob("*.arrow"))
    assert disk.resident_bytes < disk.local_disk_bytes  # only the fence indexes stay in memory


def test_a_reread_hits_the_block_cache(tmp_path: Path, local_dir: Path, small_budget: None) -> None:
    provider = _provider(tmp_path)
    info = _commits(provider, [range(KEYS * 4)]).checkpoint_info
    assert info is not None
    store = provider.get_store(info.version, info.checkpoint_id)
    assert any(isinstance(run, DiskRun) for run in store._runs())
    hot = range(0, 200)
    first = [store.get(k) for k in hot]
    again = [store.get(k) for k in hot]  # the same blocks, now in the cache
    assert first == again == [(k,) for k in hot]
    store.put(0, -1)
    store.commit()
    disk = store.metrics.disk
    assert disk.block_cache_misses > 0
    assert disk.block_cache_hits >= len(hot)  # every key of the second pass at least


def test_a_compaction_counts_the_bytes_it_wrote(
    tmp_path: Path, local_dir: Path, state_mode: str
) -> None:
    provider = _provider(tmp_path)
    before = LOCAL_DISK.snapshot()
    # Keys that interleave, so that the runs overlap and merge (runs side by side do not).
    store = _commits(provider, [range(0, 3000, 3), range(1, 3000, 3), range(2, 3000, 3)])
    disk = store.metrics.disk  # the third commit folds the changes into the base
    written = LOCAL_DISK.snapshot().bytes_written - before.bytes_written
    if state_mode == "memory":
        assert disk.compaction_bytes == written == 0
        return
    (base,) = store._runs()
    assert isinstance(base, DiskRun)
    assert disk.compaction_bytes == base.file_bytes == disk.local_disk_bytes
    assert 0 < disk.compaction_bytes < written


def test_a_stores_first_version_on_disk_is_written_once(
    tmp_path: Path, local_dir: Path, state_mode: str
) -> None:
    """The first commit's changes become the base as written (nothing to merge them with)."""
    before = LOCAL_DISK.snapshot()
    store = _commits(_provider(tmp_path), [range(0, 3000)])
    written = LOCAL_DISK.snapshot().bytes_written - before.bytes_written
    disk = store.metrics.disk
    assert disk.compaction_bytes == 0
    assert written == disk.local_disk_bytes  # one run file, once
    assert [k for k, _ in store.items()] == [(k,) for k in range(3000)]


def test_a_load_from_files_keeps_a_large_first_delta_as_its_base(
    tmp_path: Path, local_dir: Path, small_budget: None
) -> None:
    """A load applies a large first delta (streamed to disk) and five small ones that
    overwrite, remove and put back keys across deltas. The first delta, over nothing and with
    no removals, is the base as read; the small ones merge with each other in memory and go
    on top: the state is the commits', and the load writes no compaction (it wrote about the
    state's bytes once when the small deltas were merged onto the first, 6.2 times before
    that, when they were merged one at a time)."""
    provider = _provider(tmp_path)
    first = 40 * KEYS  # stored in one file of many record batches: streamed to disk
    expected = {k: k for k in range(first)}
    store = provider.get_store(0)
    store.apply_arrow(int_table(np.arange(first), np.arange(first)))
    info = store.commit()
    for step in range(1, 6):
        store = provider.get_store(info.version, info.checkpoint_id)
        puts = {k: k * 10 + step for k in range(step, first, 97)}  # overwrites
        removed = list(range(step * 7, first, 89)) if step % 2 else []
        restored = {k: -k for k in range(7, first, 89)} if step == 4 else {}
        store.apply([*puts.items(), *restored.items()])
        for k in removed:
            store.remove(k)
        info = store.commit()
        expected.update(puts)
        expected.update(restored)
        for k in removed:
            expected.pop(k, None)
    assert info.checkpoint_id is not None
    before = LOCAL_DISK.snapshot()
    loaded = _provider(tmp_path).get_store(info.version, info.checkpoint_id)
    assert loaded.metrics.load.source == LoadSource.FILES
    assert loaded.metrics.load.deltas_applied == 6
    assert {k[0]: v[0] for k, v in loaded.items()} == expected
    runs = loaded._runs()
    assert any(isinstance(run, DiskRun) for run in runs)
    state_bytes = sum(run.file_bytes for run in runs if isinstance(run, DiskRun))
    after = LOCAL_DISK.snapshot()
    assert after.compaction_bytes == before.compaction_bytes
    assert after.bytes_written - before.bytes_written == state_bytes  # the first delta, once
