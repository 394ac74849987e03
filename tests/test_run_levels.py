"""Runs whose index ranges do not overlap are kept side by side, never rewritten against each
other (issue 37, compaction): a batch of change runs in key order (a running aggregation's
chunks of whole keys) writes each row to local disk once, where merging them pairwise wrote
about log2(runs) times as much. In process, on real run files: the store answers and commits
exactly as in memory, runs that overlap still merge (only the parts they overlap), removals
are dropped when a level is folded into the base, and a level keeps at most ``MAX_PARTS``
parts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.task_spec import first_batch_store
from state_runtime import StateStoreProvider
from state_runtime.runtime import Agg, aggregation, running_aggregation
from state_runtime.storage import LocalStorage
from state_runtime.store import run_merges
from state_runtime.store.change_runs import ChangeRuns
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun, Part
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_levels import AnyRun, RunLevel, held_bytes, memory_held
from state_runtime.store.run_merges import due, merge, overlapped_rows
from state_runtime.store.run_writer import spill_run
from state_runtime.store.sorted_runs import Run
from state_runtime.store.versions import lookup, squash

from .store_helpers import INT_KEY, INT_VALUE, FewHashes, forced_disk, int_table

THRESHOLD = 20_000  # bytes: a chunk of 2,000 rows (16 bytes a row as a run) spills
CHUNK = 2_000


@contextlib.contextmanager
def _small_budget(threshold: int = THRESHOLD, block_bytes: int = 4096) -> Iterator[None]:
    saved = LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes
    LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes = threshold, block_bytes
    try:
        yield
    finally:
        LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes = saved


def _provider(root: Path) -> StateStoreProvider:
    return StateStoreProvider(
        LocalStorage(root), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )


def _chunked_batch(root: Path, chunks: list[np.ndarray], *, on_disk: bool) -> dict[str, object]:
    """Version 1 from ``chunks`` of keys (one ``apply_arrow`` each, value = key * 3), then
    version 2 removing every seventh key and updating every fifth: what the store answered,
    what it wrote locally, and the committed state."""
    provider = _provider(root)
    probes = np.arange(-5, CHUNK * len(chunks) + 5, 13, dtype=np.int64)
    with _small_budget() if on_disk else contextlib.nullcontext():
        written, compaction = LOCAL_DISK.stats.bytes_written, LOCAL_DISK.stats.compaction_bytes
        store = provider.get_store(0)
        for keys in chunks:
            store.apply_arrow(int_table(keys, keys * 3))
        pending = list(store._pending.runs)
        answers = [store.get(int(k)) for k in probes[:50]], len(store)
        first = store.commit()
        figures: dict[str, object] = {
            "written": LOCAL_DISK.stats.bytes_written - written,
            "compaction": LOCAL_DISK.stats.compaction_bytes - compaction,
            "held": sum(held_bytes(run) for run in provider.get_read_store(1)._runs()),
        }
        provider.snapshot(first.version, first.checkpoint_id)  # written from the level
        cold = _provider(root).get_read_store(first.version, first.checkpoint_id)
        figures["snapshot"] = sorted(cold.items())
        store = provider.get_store(first.version, first.checkpoint_id)
        every = np.concatenate(chunks)
        store.apply_arrow(int_table(every[::7], None))
        store.apply_arrow(int_table(every[3::5], every[3::5] + 1))
        second = store.commit()
    read = provider.get_read_store(second.version, second.checkpoint_id)
    values = read.lookup(pa.StructArray.from_arrays([pa.array(probes)], fields=list(INT_KEY)))
    return {
        "answers": answers,
        "rows": (first.rows, second.rows),
        "state": sorted(read.items()),
        "lookup": values.to_pylist(),
        "pending": pending,
        **figures,
    }


def test_chunks_in_key_order_are_written_once_and_equal_the_store_in_memory(
    tmp_path: Path,
) -> None:
    """Twelve chunk runs of 2,000 keys in key order, each past the spill threshold: one run
    file each, no compaction, the bytes written those of the state's files (merged pairwise
    they wrote about 3.5 times as much), and every answer as in memory."""
    chunks = [np.arange(i * CHUNK, (i + 1) * CHUNK, dtype=np.int64) for i in range(12)]
    disk = _chunked_batch(tmp_path / "disk", chunks, on_disk=True)
    memory = _chunked_batch(tmp_path / "memory", chunks, on_disk=False)
    for figure in ("answers", "rows", "state", "lookup", "snapshot"):
        assert disk[figure] == memory[figure], figure
    assert disk["compaction"] == 0
    assert disk["written"] == disk["held"]  # each row written once: the level's files
    pending = disk["pending"]
    assert isinstance(pending, list) and len(pending) == 1
    assert isinstance(pending[0], RunLevel) and len(pending[0].parts) == 12


def test_overlapping_chunks_still_merge_and_equal_the_store_in_memory(tmp_path: Path) -> None:
    """Chunks whose keys interleave (every chunk spans the whole range, as hashed keys do)
    merge as before: compaction bytes, the same answers as in memory."""
    every = np.arange(12 * CHUNK, dtype=np.int64)
    chunks = [every[i::12] for i in range(12)]
    disk = _chunked_batch(tmp_path / "disk", chunks, on_disk=True)
    memory = _chunked_batch(tmp_path / "memory", chunks, on_disk=False)
    for figure in ("answers", "rows", "state", "lookup"):
        assert disk[figure] == memory[figure], figure
    assert disk["compaction"] > 0


def _run(keys: np.ndarray, values: np.ndarray | None) -> Run:
    value = (
        pa.nulls(len(keys), INT_VALUE)
        if values is None
        else pa.StructArray.from_arrays([pa.array(values)], fields=list(INT_VALUE))
    )
    keys_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(INT_KEY))
    return Run.build(KeyIndexer(INT_KEY), keys_array, value)[0]


def _rows(run: AnyRun) -> list[tuple[object, object]]:
    return [row for block in run.blocks() for row in block.rows()]


def test_a_run_overlapping_one_part_rewrites_that_part_alone() -> None:
    """A level of three parts on disk under a change run overlapping the middle one: the
    first and last parts are kept (the same files), the middle is merged with the change, the
    rows equal the in-memory merge, with removals dropped or kept as asked."""
    indexer = KeyIndexer(INT_KEY)
    with _small_budget():
        parts = [
            spill_run("s", _run(np.arange(a, a + 3000), np.arange(3000))) for a in (0, 5000, 10000)
        ]
        assert all(isinstance(p, DiskRun) for p in parts)
        older = merge(
            indexer,
            merge(indexer, parts[0], parts[1], drop_removals=False, store="s"),
            parts[2],
            drop_removals=False,
            store="s",
        )
        assert isinstance(older, RunLevel) and older.parts == tuple(parts)
        changes = _run(np.arange(6000, 7000), None).merged_with(
            indexer, _run(np.arange(6500, 9000), -np.arange(6500, 9000)), drop_removals=False
        )
        for drop in (False, True):
            merged = merge(indexer, older, spill_run("s", changes), drop_removals=drop, store="s")
            assert isinstance(merged, RunLevel)
            assert merged.parts[0] is parts[0] and merged.parts[-1] is parts[2]
            expected = _level_rows(older).merged_with(indexer, changes, drop_removals=drop)
            assert _rows(merged) == list(expected.rows())
            assert len(merged) == len(expected) and merged.removals == expected.removals
            probes = np.arange(-10, 13010, 7)
            keys = pa.StructArray.from_arrays([pa.array(probes)], fields=list(INT_KEY))
            found, values = merged.find(indexer, probes, keys)
            want, want_values = expected.find(indexer, probes, keys)
            assert (found == want).all() and values.equals(want_values)
            assert [merged.value_at(int(i)) for i in found[found >= 0][::50]] == [
                expected.value_at(int(i)) for i in want[want >= 0][::50]
            ]


def _level_rows(run: AnyRun) -> Run:
    blocks = list(run.blocks())
    return Run(
        np.concatenate([b.index for b in blocks]),
        pa.concat_arrays([b.keys for b in blocks]),
        pa.concat_arrays([b.values for b in blocks]),
    )


def test_folding_a_level_drops_its_removals_and_keeps_its_parts_in_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Disjoint change runs folded into a base (``drop_removals``): past ``MAX_PARTS`` the
    adjacent parts with the fewest rows together are rewritten as one; a run of removals
    alone, over none of the level's keys, leaves nothing and the parts are kept."""
    monkeypatch.setattr(run_merges, "MAX_PARTS", 4)
    indexer = KeyIndexer(INT_KEY)
    with _small_budget():
        base = spill_run("s", _run(np.arange(0, 2000), np.arange(2000)))
        level: AnyRun = base
        for i in range(1, 7):
            keys = np.arange(i * 2000, (i + 1) * 2000)
            level = merge(
                indexer, level, spill_run("s", _run(keys, keys)), drop_removals=True, store="s"
            )
        assert isinstance(level, RunLevel) and len(level.parts) == 4
        assert _rows(level) == list(
            _run(np.arange(14000), np.r_[np.arange(2000), np.arange(2000, 14000)]).rows()
        )
        removals = spill_run("s", _run(np.arange(20000, 22000), None))
        folded = merge(indexer, level, removals, drop_removals=True, store="s")
        assert isinstance(folded, RunLevel) and folded.parts == level.parts
        assert not folded.removals


def _part_with_removals(keys: np.ndarray) -> DiskRun:
    """A part on disk whose every other key is a removal (the others' value is the key)."""
    values = pa.StructArray.from_arrays(
        [pa.array(keys)], fields=list(INT_VALUE), mask=pa.array(np.arange(len(keys)) % 2 == 1)
    )
    keys_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(INT_KEY))
    part = spill_run("s", Run.build(KeyIndexer(INT_KEY), keys_array, values)[0])
    assert isinstance(part, DiskRun) and part.removals == len(keys) // 2
    return part


def test_folding_a_level_rewrites_only_the_part_holding_removals() -> None:
    """A level whose middle part holds removals, folded (``drop_removals``) with a run beside
    it: that part alone is rewritten, without its removals; the others are kept as they are."""
    indexer = KeyIndexer(INT_KEY)
    with _small_budget():
        left = spill_run("s", _run(np.arange(0, 2000), np.arange(2000)))
        middle = _part_with_removals(np.arange(2000, 4000))
        right = spill_run("s", _run(np.arange(4000, 6000), np.arange(4000, 6000)))
        level = RunLevel([left, middle, right])
        newer = spill_run("s", _run(np.arange(8000, 10000), np.arange(8000, 10000)))
        folded = merge(indexer, level, newer, drop_removals=True, store="s")
        assert isinstance(folded, RunLevel) and len(folded.parts) == 4
        kept = folded.parts[0], folded.parts[2], folded.parts[3]
        assert kept == (left, right, newer)
        rewritten = folded.parts[1]
        assert rewritten is not middle and isinstance(rewritten, DiskRun)
        assert rewritten.removals == 0 and not folded.removals
        assert _rows(rewritten) == [((k,), (k,)) for k in range(2000, 4000, 2)]


def test_due_counts_only_the_parts_the_newer_parts_overlap() -> None:
    """A newer level of two parts over an older level of three: the older part in the gap
    between the newer parts is not overlapped, so it does not count against the merge."""
    with _small_budget():
        older = RunLevel(
            [
                spill_run("s", _run(np.arange(a, a + 3000), np.arange(3000)))
                for a in (0, 10_000, 20_000)
            ]
        )
        newer = RunLevel(
            [spill_run("s", _run(np.arange(a, a + 1500), np.arange(1500))) for a in (0, 20_000)]
        )
    assert overlapped_rows(older, newer) == 6000  # the first and last parts
    assert due(older, newer)  # 3,000 newer rows: half of 6,000


def test_a_levels_parts_in_memory_stay_within_the_threshold() -> None:
    """Parts in memory each under the threshold but over it together: the largest go to disk
    until the rest fit, and the rows are unchanged."""
    with _small_budget():
        kept: list[Part] = []
        for i, rows in enumerate((600, 2000, 1100, 2000, 500)):
            part = _run(np.arange(i * 5000, i * 5000 + rows), np.arange(rows))
            kept.append(spill_run("s", part) if rows == 2000 else part)
        assert all(p.nbytes <= THRESHOLD for p in kept if isinstance(p, Run))
        level = run_merges.level(kept, "s", (INT_KEY, INT_VALUE))
        assert isinstance(level, RunLevel)
        assert memory_held([level]) <= THRESHOLD
        assert [isinstance(p, DiskRun) for p in level.parts] == [False, True, True, True, False]
        assert _rows(level) == [row for p in kept for row in _rows(p)]


def test_change_runs_count_the_parts_in_memory_of_their_levels() -> None:
    """Pushes that squash below the threshold (each key twice) between disjoint ones that
    spill: the change runs' levels hold no more than the threshold in memory."""
    with _small_budget():
        changes = ChangeRuns(KeyIndexer(INT_KEY), "s")
        for start, rows, times in (
            (0, 2000, 1),
            (10_000, 800, 2),
            (15_000, 2000, 1),
            (20_000, 800, 2),
        ):
            for t in range(times):
                changes.push(_run(np.arange(start, start + rows), np.arange(rows) + t))
                assert memory_held(changes.runs) <= THRESHOLD
        assert len(changes.squashed()) == 5600


def _first_batch(root: Path, keys: np.ndarray, *, on_disk: bool) -> dict[str, object]:
    """A running count's first batch of ``keys`` (every key new), in chunks of 2,000 rows."""
    op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], 1)
    with _small_budget() if on_disk else contextlib.nullcontext():
        compaction = LOCAL_DISK.stats.compaction_bytes
        with first_batch_store(op, LocalStorage(root)) as (provider, store):
            output = aggregation.whole_output(op.update(store, pa.table({"k": pa.array(keys)})))
            info = store.commit()
        compaction = LOCAL_DISK.stats.compaction_bytes - compaction
    state = provider.get_read_store(info.version, info.checkpoint_id)
    assert output is not None
    return {
        "output": sorted(output.to_pylist(), key=lambda r: r["k"]),
        "state": sorted(state.items()),
        "compaction": compaction,
    }


def test_a_running_aggregations_first_batch_in_chunks_writes_no_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case of issue 37's 5M-key run: a first batch of shuffled new keys taken in
    chunks of whole keys, in key order; each chunk spills and none is merged."""
    monkeypatch.setattr(aggregation, "CHUNK_ROWS", CHUNK)
    keys = np.random.default_rng(5).permutation(24_000).astype(np.int64)
    keys = np.concatenate([keys, keys[:3000]])  # some keys twice
    disk = _first_batch(tmp_path / "disk", keys, on_disk=True)
    memory = _first_batch(tmp_path / "memory", keys, on_disk=False)
    assert disk["output"] == memory["output"] and disk["state"] == memory["state"]
    assert disk["compaction"] == 0


STR_KEY = pa.struct([("s", pa.string())])
Changes = dict[int, int | None]
"""A change run's rows: key ``k<n>`` -> value (None: a removal)."""

STACKS = st.lists(
    st.tuples(
        st.dictionaries(
            st.integers(0, 80), st.none() | st.integers(-3, 3), min_size=1, max_size=60
        ),
        st.booleans(),
    ),
    min_size=2,
    max_size=7,
)
"""Change runs, newest first: each its rows and whether it is spilled to disk."""


def _keys(numbers: list[int]) -> pa.StructArray:
    return pa.StructArray.from_arrays([pa.array([f"k{n}" for n in numbers])], fields=list(STR_KEY))


def _string_run(indexer: KeyIndexer, changes: Changes) -> Run:
    values = pa.StructArray.from_arrays(
        [pa.array([v or 0 for v in changes.values()], pa.int64())],
        fields=list(INT_VALUE),
        mask=pa.array([v is None for v in changes.values()]),
    )
    return Run.build(indexer, _keys(list(changes)), values)[0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stack=STACKS)
def test_squashing_the_smallest_neighbours_first_equals_merging_oldest_first(
    stack: list[tuple[Changes, bool]],
) -> None:
    """Random stacks of change runs, some spilled to disk and some in memory, under a budget
    of a few dozen rows (merged runs past it spill too), string keys whose index keys
    collide, removals: :func:`squash` (the two neighbours of fewest rows first) gives the rows
    and lookups of merging them one by one oldest first, and of the newest change of each key
    winning; ``over_nothing`` leaves the same live rows."""
    indexer = FewHashes(STR_KEY, 8)
    model: Changes = {}
    for changes, _ in reversed(stack):
        model.update(changes)
    with _small_budget(threshold=600, block_bytes=128):
        runs: list[AnyRun] = []
        for changes, on_disk in stack:
            run = _string_run(indexer, changes)
            if on_disk:  # a run meant for memory is kept there, whatever the budget says
                with forced_disk(block_bytes=128):
                    run = spill_run("s", run)
            runs.append(run)
        assert [isinstance(r, DiskRun) for r in runs] == [on_disk for _, on_disk in stack]
        squashed = squash(indexer, runs, "s")
        oldest_first = runs[-1]
        for newer in runs[-2::-1]:
            oldest_first = merge(indexer, oldest_first, newer, drop_removals=False, store="s")
        over_nothing = squash(indexer, runs, "s", over_nothing=True)
        expected = sorted(((f"k{n}",), None if v is None else (v,)) for n, v in model.items())
        assert sorted(_rows(squashed)) == sorted(_rows(oldest_first)) == expected
        live = [(k, v) for k, v in expected if v is not None]
        assert [(k, v) for k, v in sorted(_rows(over_nothing)) if v is not None] == live
        probes = _keys(list(range(90)))
        found = lookup(indexer, [squashed], probes, INT_VALUE).to_pylist()
        assert found == [None if model.get(n) is None else {"v": model[n]} for n in range(90)]
