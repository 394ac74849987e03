"""Runs on local disk: the fence index against the in-memory run, streamed merges, and the
typed error when local disk is short (on a real 1 MiB tmpfs when this machine can mount one)."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.peak_memory import peak_rss, reset_peak
from state_runtime import StateStoreProvider
from state_runtime.errors import InvalidArgument, LocalDiskFull, StateStoreError
from state_runtime.storage import LocalStorage
from state_runtime.store import mapped_probes
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun
from state_runtime.store.field_words import FieldWords
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.open_runs import OPEN_RUNS
from state_runtime.store.run_merges import merge
from state_runtime.store.run_writer import RunWriter, spill_run, written
from state_runtime.store.sorted_runs import Run
from state_runtime.store.versions import MEMO_FRACTION

from .store_helpers import FewHashes, forced_disk, local_tmpfs

KEY = pa.struct([("k", pa.int64())])
VALUE = pa.struct([("v", pa.int64())])


def _run(keys: np.ndarray, values: np.ndarray | None) -> Run:
    indexer = KeyIndexer(KEY)
    key_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
    value_array = (
        pa.nulls(len(keys), VALUE)
        if values is None
        else pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE))
    )
    return Run.build(indexer, key_array, value_array)[0]


def _rows(run: DiskRun) -> list[tuple[object, object]]:
    return [row for block in run.blocks() for row in block.rows()]


def test_a_run_on_disk_answers_as_in_memory() -> None:
    indexer = KeyIndexer(KEY)
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(-(10**6), 10**6, 5000))
    run = _run(keys, keys * 3)
    with forced_disk(block_bytes=1024):
        on_disk = spill_run("s", run)
    assert isinstance(on_disk, DiskRun) and on_disk.block_count > 10
    probes = np.concatenate([rng.choice(keys, 1500), rng.integers(-(10**6), 10**6, 1500)])
    probe_keys = pa.StructArray.from_arrays([pa.array(probes)], fields=list(KEY))
    index = indexer.index(probe_keys)
    expected, expected_values = run.find(indexer, index, probe_keys)
    found, values = on_disk.find(indexer, index, probe_keys)
    assert (found == expected).all() and values.equals(expected_values)
    for p in probes[:200]:
        assert on_disk.position_of(indexer, int(p), (int(p),)) == run.position_of(
            indexer, int(p), (int(p),)
        )
    assert len(values) == int((expected >= 0).sum()) >= 1500
    assert _rows(on_disk) == list(run.rows())


def test_plain_values_are_read_as_words_once_their_block_is_learnt() -> None:
    """Values of plain numbers (an int32 and a float64 field) in a run on disk with removals
    in some blocks: the first batch lookup takes them through Arrow and learns where each
    block's fields lie, the second reads the learnt blocks' values as words (no record batch
    read for them), both equal to the run in memory; blocks holding a removal are never
    learnt."""
    indexer = KeyIndexer(KEY)
    value_type = pa.struct([("a", pa.int32()), ("b", pa.float64())])
    keys = np.arange(0, 40_000, 2, dtype=np.int64)
    removed = (keys // 2) % 997 == 0  # a removal every 997 rows: some blocks hold one
    a = pa.array((keys % 1000).astype(np.int32))
    b = pa.array(keys * 0.5)
    values = pa.StructArray.from_arrays([a, b], fields=list(value_type), mask=pa.array(removed))
    key_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
    run = Run.build(indexer, key_array, values)[0]
    with forced_disk(block_bytes=4096):
        on_disk = spill_run("s", run)
    assert isinstance(on_disk, DiskRun) and on_disk.block_count > 40
    probes = np.random.default_rng(3).integers(-10, 40_010, 6000)
    probe_keys = pa.StructArray.from_arrays([pa.array(probes)], fields=list(KEY))
    index = indexer.index(probe_keys)
    expected, expected_values = run.find(indexer, index, probe_keys)
    reads: list[int] = []
    real_get_batch = pa.ipc.RecordBatchFileReader.get_batch
    answers = []
    for _ in range(2):
        reads.clear()
        with mock.patch.object(
            pa.ipc.RecordBatchFileReader,
            "get_batch",
            lambda self, i: reads.append(i) or real_get_batch(self, i),
        ):
            found, got = on_disk.find(indexer, index, probe_keys)
        assert (found == expected).all() and got.equals(expected_values)
        answers.append(sorted(set(reads)))
    holding_removals = {blk for blk in range(on_disk.block_count) if on_disk.block(blk).removals}
    assert len(answers[0]) == on_disk.block_count  # every block touched, read once
    assert set(answers[1]) == holding_removals and holding_removals


def test_a_block_whose_fields_lie_past_the_mapping_is_not_learnt() -> None:
    """A block is learnt only where its field data lies wholly inside the mapping: one byte
    short, and it keeps the Arrow path."""
    value_type = pa.struct([("a", pa.int64())])
    values = pa.StructArray.from_arrays([pa.array(np.arange(64))], fields=list(value_type))
    keys = pa.array(np.arange(64))
    batch = pa.RecordBatch.from_arrays([keys, keys, values], names=["i", "k", "v"])
    base = values.field(0).buffers()[1].address
    for size, learnt in ((64 * 8 - 1, False), (64 * 8, True)):
        words = FieldWords.of(value_type, 1)
        assert words is not None
        words.learn((base, size), [0], [batch])
        assert bool(words.at[0, 0] >= 0) == learnt


@pytest.fixture(scope="module")
def big_run() -> tuple[Run, DiskRun]:
    """A run of 1.6M rows in memory and on disk (38 MB, blocks of 64 KiB)."""
    keys = np.arange(0, 3_200_000, 2, dtype=np.int64)
    run = _run(keys, keys * 3)
    with forced_disk(block_bytes=64 << 10):
        on_disk = spill_run("s", run)
    assert isinstance(on_disk, DiskRun) and on_disk.block_count > 50
    return run, on_disk


def _grown_by_lookup(
    run: Run, on_disk: DiskRun, probes: np.ndarray, spill_bytes: int
) -> tuple[int, pa.StructArray]:
    """How much the peak resident memory grows while ``on_disk`` looks ``probes`` up with
    that spill threshold (groups of blocks at most that long), checked against ``run``."""
    indexer = KeyIndexer(KEY)
    probe_keys = pa.StructArray.from_arrays([pa.array(probes)], fields=list(KEY))
    index = indexer.index(probe_keys)
    expected, expected_values = run.find(indexer, index, probe_keys)
    with forced_disk(block_bytes=64 << 10):
        LOCAL_DISK.spill_bytes = spill_bytes
        resident = reset_peak()
        found, values = on_disk.find(indexer, index, probe_keys)
        grown = peak_rss() - resident
    assert (found == expected).all() and values.equals(expected_values)
    return grown, values


def test_a_batch_lookup_on_disk_reads_no_block_whole_and_keeps_few_of_its_pages(
    monkeypatch: pytest.MonkeyPatch, big_run: tuple[Run, DiskRun]
) -> None:
    """A batch of random keys touching every block of a 38 MB run on disk answers as in
    memory without reading any block whole (the file is mapped and only the pages the probes
    touch are read), and the pages leave the process group by group: its peak resident memory
    grows by far less than the file."""
    run, on_disk = big_run

    def no_whole_block(self: DiskRun, b: int) -> object:
        raise AssertionError(f"block {b} read whole")

    monkeypatch.setattr(DiskRun, "_read", no_whole_block)
    probes = np.random.default_rng(5).integers(-10, 3_200_010, 20_000)
    before = LOCAL_DISK.snapshot()
    grown, _ = _grown_by_lookup(run, on_disk, probes, 0)  # groups of one block
    assert LOCAL_DISK.activity_since(before).block_cache_misses == on_disk.block_count
    assert grown < on_disk.file_bytes // 4, (grown, on_disk.file_bytes)


def test_a_sparse_batch_lookup_on_disk_maps_only_the_pages_its_probes_touch(
    big_run: tuple[Run, DiskRun],
) -> None:
    """Two keys, in the first and the last block of a 38 MB run, with a spill threshold of
    1 GiB (one group spanning the whole file): the pages between them are never mapped,
    so the peak resident memory grows by far less than the file (mapping the group's span
    at once grew it by the whole file)."""
    run, on_disk = big_run
    grown, values = _grown_by_lookup(run, on_disk, np.array([2, 3_199_996]), 1 << 30)
    assert len(values) == 2
    assert grown < on_disk.file_bytes // 8, (grown, on_disk.file_bytes)


def test_a_run_file_unreadable_once_written_fails_typed_and_leaves_no_file() -> None:
    """The blocks written first are lost from the file (truncated: the writer goes on past a
    hole of zeros), so finding each block's index column fails: the error is the store's,
    names the store and the file, and neither the file nor its bytes are left counted."""
    run = _run(np.arange(20_000), np.arange(20_000))
    before = LOCAL_DISK.snapshot().local_disk_bytes
    with forced_disk(block_bytes=1024):
        writer = RunWriter("store-y", KEY, VALUE, 0)
        writer.add(run.slice(0, 10_000))
        os.truncate(writer.path, 100)
        writer.add(run.slice(10_000, 20_000))
        with pytest.raises(StateStoreError) as caught:
            writer.finish(compaction=False)
    error = caught.value
    assert error.store == "store-y" and error.path == writer.path
    assert "index column" in error.reason or "Arrow IPC message" in error.reason
    assert not os.path.exists(writer.path)
    assert LOCAL_DISK.snapshot().local_disk_bytes == before


def test_a_run_on_disk_refuses_dictionary_typed_columns() -> None:
    """Dictionary batches would precede the blocks in the file, where the index column of
    each is looked for: refused before anything is written."""
    key_type = pa.struct([("k", pa.dictionary(pa.int32(), pa.string()))])
    with pytest.raises(InvalidArgument, match="dictionary"):
        RunWriter("store-z", key_type, VALUE, 0)


def test_a_failed_batch_lookup_on_disk_leaves_no_view_of_the_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup failing midway drops its views of the map (kept open between lookups), so
    the file is unmapped at once when its run is dropped, not when the traceback holding
    them is collected; a later lookup answers."""
    indexer = KeyIndexer(KEY)
    with forced_disk(block_bytes=1024):
        on_disk = spill_run("s", _run(np.arange(5000), np.arange(5000)))
    assert isinstance(on_disk, DiskRun)

    def failing(*args: object) -> object:
        raise RuntimeError("lookup failed")

    monkeypatch.setattr(mapped_probes, "_touched", failing)
    probe_keys = pa.StructArray.from_arrays([pa.array(np.arange(10))], fields=list(KEY))
    with pytest.raises(RuntimeError) as caught:
        on_disk.find(indexer, indexer.index(probe_keys), probe_keys)
    assert caught.traceback  # the frames that held the views are still alive
    monkeypatch.undo()
    found, values = on_disk.find(indexer, indexer.index(probe_keys), probe_keys)
    assert found.tolist() == list(range(10)) and values.field("v").to_pylist() == list(range(10))
    assert on_disk.path in Path("/proc/self/maps").read_text()  # kept mapped between lookups
    OPEN_RUNS.close(on_disk.path)
    assert on_disk.path not in Path("/proc/self/maps").read_text()


def test_a_batch_lookup_on_disk_answers_without_madvise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the platform has no ``madvise`` the pages simply fault in: the same answers."""
    monkeypatch.setattr(mapped_probes, "MADV_DONTNEED", None)
    indexer = KeyIndexer(KEY)
    run = _run(np.arange(0, 10_000, 2), np.arange(5000))
    with forced_disk(block_bytes=1024):
        on_disk = spill_run("s", run)
    probe_keys = pa.StructArray.from_arrays([pa.array(np.arange(0, 10_000, 3))], fields=list(KEY))
    index = indexer.index(probe_keys)
    expected, expected_values = run.find(indexer, index, probe_keys)
    found, values = on_disk.find(indexer, index, probe_keys)
    assert (found == expected).all() and values.equals(expected_values)


def test_a_batch_lookup_on_disk_finds_keys_whose_index_keys_collide() -> None:
    """Hashed keys sharing an index key: the mapped search lands on the first row with that
    index key; the key comparison sends the others to their block, found as in memory."""
    key_type = pa.struct([("s", pa.string())])
    indexer = FewHashes(key_type, 128)
    names = [f"key-{i}" for i in range(1200)]
    keys = pa.StructArray.from_arrays([pa.array(names)], fields=list(key_type))
    values = pa.StructArray.from_arrays([pa.array(np.arange(1200))], fields=list(VALUE))
    run = Run.build(indexer, keys, values)[0]
    with forced_disk(block_bytes=1024):
        on_disk = spill_run("s", run)
    assert isinstance(on_disk, DiskRun) and on_disk.block_count > 8
    probe_names = [f"key-{i}" for i in range(0, 1320, 3)]  # some absent
    probes = pa.StructArray.from_arrays([pa.array(probe_names)], fields=list(key_type))
    index = indexer.index(probes)
    expected, expected_values = run.find(indexer, index, probes)
    found, found_values = on_disk.find(indexer, index, probes)
    assert (found == expected).all() and found_values.equals(expected_values)
    assert (found >= 0).sum() == 400


def test_a_streamed_merge_equals_the_in_memory_merge() -> None:
    indexer = KeyIndexer(KEY)
    old = _run(np.arange(0, 20000, 2), np.arange(10000))
    new_keys = np.arange(0, 30000, 3)
    new = _run(new_keys, np.where(new_keys % 2 == 0, new_keys, -new_keys))
    removals = _run(np.arange(0, 30000, 5), None)
    for drop in (False, True):
        changes = new.merged_with(indexer, removals, drop_removals=False)
        expected = old.merged_with(indexer, changes, drop_removals=drop)
        with forced_disk(block_bytes=2048):
            merged = merge(
                indexer, spill_run("s", old), spill_run("s", changes), drop_removals=drop, store="s"
            )
        assert isinstance(merged, DiskRun)
        assert _rows(merged) == list(expected.rows())
        assert merged.removals == expected.removals


def test_opening_a_store_larger_than_local_disk_fails_typed(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    storage = LocalStorage(str(tmp_path / "root"))
    writer = StateStoreProvider(storage, 0, 3, key_schema="k bigint", value_schema="v bigint")
    store = writer.get_store(0)
    keys = pa.StructArray.from_arrays([pa.array(np.arange(200_000))], fields=list(KEY))
    store.apply_arrow(
        pa.table(
            {
                "key": keys,
                "value": pa.StructArray.from_arrays(
                    [pa.array(np.arange(200_000))], fields=list(VALUE)
                ),
            }
        )
    )
    info = store.commit()  # 3.2 MB of state, in memory (the default budget)
    reader = StateStoreProvider(storage, 0, 3, key_schema="k bigint", value_schema="v bigint")
    with forced_disk(), pytest.raises(LocalDiskFull) as caught:
        reader.get_store(info.version, info.checkpoint_id)
    error = caught.value
    assert error.code == "STATE_LOCAL_DISK_FULL"
    assert error.needed >= 3_200_000 and error.free <= 1 << 20
    assert error.store == reader.store_id
    assert f"{error.needed} bytes needed, {error.free} bytes free" in str(error)
    assert error.details()["needed"] == error.needed


def test_a_disk_filling_up_while_writing_fails_typed_and_leaves_no_file(
    small_tmpfs: Path,
) -> None:
    big = _run(np.arange(200_000), np.arange(200_000))
    with pytest.raises(LocalDiskFull) as caught:  # no up-front estimate: the write hits ENOSPC
        written("store-x", [big], KEY, VALUE, 0, compaction=False)
    assert "filled up" in caught.value.reason and caught.value.store == "store-x"
    assert not [p for p in small_tmpfs.rglob("*.arrow")]


def test_a_store_on_disk_keeps_two_cached_versions(tmp_path: Path) -> None:
    """Runs on disk count only their fences against the budget: without this bound every
    version ever committed would keep its files."""
    provider = StateStoreProvider(
        LocalStorage(str(tmp_path)), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    info = None
    with forced_disk():
        for start in range(0, 600, 100):
            store = (
                provider.get_store(0)
                if info is None
                else provider.get_store(info.version, info.checkpoint_id)
            )
            store.apply([(k, k) for k in range(start, start + 100)])
            info = store.commit()
        assert [r.version for r in provider.cached_versions] == [0, 5, 6]  # 0: empty
        old = provider.get_read_store(2, None)  # back from files, equal
        assert {k[0] for k, _ in old.items()} == set(range(200))


def test_a_snapshot_write_that_fills_local_disk_fails_typed_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(str(tmp_path / "root"))
    provider = StateStoreProvider(storage, 0, 4, key_schema="k bigint", value_schema="v bigint")
    keys = np.arange(200_000)
    values = np.random.default_rng(5).integers(0, 1 << 62, len(keys))  # 1.6 MB, compressed
    with forced_disk(block_bytes=1 << 16):
        store = provider.get_store(0)
        store.apply_arrow(
            pa.table(
                {
                    "key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY)),
                    "value": pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE)),
                }
            )
        )
        info = store.commit()  # its runs on disk, in the default folder
        with local_tmpfs(tmp_path) as mount:
            with pytest.raises(LocalDiskFull) as caught:
                provider.snapshot(info.version, info.checkpoint_id)  # its spool: the tmpfs
            assert not list(mount.rglob("*.snapshot"))
    assert "filled up while writing a snapshot" in caught.value.reason
    assert caught.value.store == provider.store_id
    assert not storage.exists(info.path.replace(".delta", ".snapshot"))


def test_a_delta_write_that_fills_local_disk_fails_typed_and_aborts_the_store(
    tmp_path: Path,
) -> None:
    """A delta larger than one record batch goes through a local file: with no room for it
    the commit fails with LocalDiskFull, nothing is written to storage and the store is
    aborted."""
    storage = LocalStorage(str(tmp_path / "root"))
    provider = StateStoreProvider(storage, 0, 5, key_schema="k bigint", value_schema="v bigint")
    keys = np.arange(200_000)
    values = np.random.default_rng(6).integers(0, 1 << 62, len(keys))  # 1.6 MB, compressed
    store = provider.get_store(0)
    store.apply_arrow(
        pa.table(
            {
                "key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY)),
                "value": pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE)),
            }
        )
    )
    with local_tmpfs(tmp_path) as mount:
        with pytest.raises(LocalDiskFull) as caught:
            store.commit()
        assert not list(mount.rglob("*.delta"))
    assert "filled up while writing a delta" in caught.value.reason
    assert caught.value.store == provider.store_id
    assert caught.value.needed >= 200_000 * 16
    assert not list((tmp_path / "root").rglob("*.delta"))  # nothing written to storage
    assert not store.has_committed
    store.abort()  # already aborted: a no-op


def _count_store(tmp_path: Path, keys: int) -> tuple[StateStoreProvider, CheckpointInfo]:
    provider = StateStoreProvider(
        LocalStorage(str(tmp_path)), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    store = provider.get_store(0)
    store.apply_arrow(_table(np.arange(keys), np.arange(keys)))
    return provider, store.commit()


def _table(keys: np.ndarray, values: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY)),
            "value": pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE)),
        }
    )


@pytest.mark.parametrize("changed_first", [False, True])
def test_a_commit_counts_rows_from_its_batch_lookup_without_reading_blocks_again(
    tmp_path: Path, changed_first: bool
) -> None:
    """A read-modify-write batch on disk: the commit counts the rows its changes add (new
    keys) or remove from what the batch's lookup found, reading no block again. A change
    made before the lookup (a new key, looked up too) makes the lookup's answers the store's,
    not the version's: the commit then looks its changes up in the version, and the count
    stays right (it would count the new key as present before)."""
    with forced_disk(block_bytes=1024):
        provider, info = _count_store(tmp_path, 5000)
        store = provider.get_store(info.version, info.checkpoint_id)
        if changed_first:
            store.put(6050, 7)  # a new key, before the lookup
        rng = np.random.default_rng(3)
        keys = np.concatenate([np.unique(rng.integers(0, 5000, 300)), np.arange(6000, 6100)])
        key_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
        old = store.lookup(key_array).field("v").to_numpy(zero_copy_only=False)
        new_keys = keys >= 6000
        assert np.isnan(old[new_keys]).sum() == 100 - int(changed_first)
        store.apply_arrow(_table(keys, np.nan_to_num(old).astype(np.int64) + 1))
        removed = keys[:50]
        for k in removed:
            store.remove(int(k))
        before = LOCAL_DISK.snapshot()
        info = store.commit()
        reads = LOCAL_DISK.activity_since(before)
        expected = 5000 + 100 - 50
        assert len(store) == expected
        fresh = provider.get_read_store(info.version, info.checkpoint_id)
        assert sum(1 for _ in fresh.items()) == expected
        looked_again = reads.block_cache_hits + reads.block_cache_misses
        assert (looked_again > 0) == changed_first


@pytest.mark.parametrize("ending", ["commit", "abort"])
def test_the_lookup_memo_stays_within_its_cap_and_is_dropped_at_commit_or_abort(
    tmp_path: Path, ending: str
) -> None:
    """Ten read-modify-write lookups under a 256 KiB budget: the memo keeps what fits its cap
    (1/MEMO_FRACTION of the budget) and no more; the commit looks the rest up in the version
    (reading blocks on disk), so its row count and rows are those of a store with no cap. The
    memo is gone after the commit or the abort, and a later lookup adds nothing."""
    saved = CACHE.budget
    set_budget(256 << 10)
    try:
        with forced_disk(block_bytes=1024):
            provider, info = _count_store(tmp_path, 5000)
            store = provider.get_store(info.version, info.checkpoint_id)
            cap = (256 << 10) // MEMO_FRACTION
            batches = [np.arange(i * 500, i * 500 + 300) for i in range(10)]
            batches[-1] = np.arange(4800, 5100)  # 100 new keys
            for keys in batches:
                key_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
                old = store.lookup(key_array).field("v").to_numpy(zero_copy_only=False)
                assert np.isnan(old).sum() == int((keys >= 5000).sum())
                assert 0 < store._looked_up.nbytes <= cap
            kept = len(store._looked_up.runs)
            assert 0 < kept < len(batches)  # the cap was reached
            looked_up = np.concatenate(batches)
            if ending == "abort":
                store.abort()
            else:
                store.apply_arrow(_table(looked_up, looked_up + 1))
                for k in looked_up[:50]:
                    store.remove(int(k))
                before = LOCAL_DISK.snapshot()
                info = store.commit()
                reads = LOCAL_DISK.activity_since(before)
                assert reads.block_cache_hits + reads.block_cache_misses > 0  # past the cap
                expected = {k: k for k in range(5000)}
                expected.update({int(k): int(k) + 1 for k in looked_up})
                for k in looked_up[:50]:
                    del expected[int(k)]
                assert len(store) == info.rows == len(expected) == 5000 + 100 - 50
                fresh = provider.get_read_store(info.version, info.checkpoint_id)
                assert dict(fresh.items()) == {(k,): (v,) for k, v in expected.items()}
            assert store._looked_up.runs == [] and store._looked_up.nbytes == 0
            store.lookup(pa.StructArray.from_arrays([pa.array([1, 2])], fields=list(KEY)))
            assert store._looked_up.runs == []
    finally:
        set_budget(saved)


def test_a_roll_forward_and_a_cold_load_on_disk_read_no_block(tmp_path: Path) -> None:
    """A store that moved between workers rolls its older copy forward over the deltas it
    missed, and a worker that never held it loads it from files: both take the row count
    from the newest delta's header (its bytes verified), reading no block of the runs on
    disk (counting it again looked every delta's keys up: a batch lookup a delta), and both
    equal the store that committed."""
    with forced_disk(block_bytes=1024):
        writer, info = _count_store(tmp_path, 5000)
        lagging = StateStoreProvider(
            LocalStorage(str(tmp_path)), 0, 0, key_schema="k bigint", value_schema="v bigint"
        )
        lagging.get_store(info.version, info.checkpoint_id).abort()  # holds version 1
        rng = np.random.default_rng(5)
        for batch in range(2):
            store = writer.get_store(info.version, info.checkpoint_id)
            keys = np.unique(np.r_[rng.integers(0, 5000, 200), 7000 + np.arange(30) + batch])
            store.apply_arrow(_table(keys, keys + batch))
            for k in rng.integers(0, 5000, 20):
                store.remove(int(k))
            info = store.commit()
        expected = sorted(writer.get_read_store(info.version, info.checkpoint_id).items())
        cold = StateStoreProvider(
            LocalStorage(str(tmp_path)), 0, 0, key_schema="k bigint", value_schema="v bigint"
        )
        for provider, source in ((lagging, "roll_forward"), (cold, "files")):
            before = LOCAL_DISK.snapshot()
            store = provider.get_store(info.version, info.checkpoint_id)
            reads = LOCAL_DISK.activity_since(before)
            assert store.metrics.load.source.value == source
            assert reads.block_cache_hits + reads.block_cache_misses == 0
            assert len(store) == len(expected) and sorted(store.items()) == expected
            store.abort()
