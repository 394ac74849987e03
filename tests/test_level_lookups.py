"""Batch lookups over a level of runs side by side (issue 37): the parts on disk that probes
fall in answer together, in one search over their blocks, through maps of their files kept
open between lookups; they cost about what one file of the same rows costs
(``bench_disk.py --levels``). On real run files: a level answers exactly as the same rows in
memory, whatever the keys (exact integers read as words, hashed strings that collide, values
read through Arrow), a part in memory among parts on disk, and an open-file limit below the
part count. A damaged part's file is refused, naming it, never read past its end into the
next map; a view of the maps left in a failed lookup's traceback keeps them mapped."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from state_runtime.errors import StateStoreError
from state_runtime.store.disk_runs import DiskRun, Part
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.mapped_region import Region, RunFile
from state_runtime.store.open_runs import OPEN_RUNS
from state_runtime.store.run_levels import RunLevel
from state_runtime.store.run_writer import spill_run
from state_runtime.store.sorted_runs import Run

from .store_helpers import FewHashes, forced_disk

INT_KEY = pa.struct([("k", pa.int64())])
STR_KEY = pa.struct([("s", pa.string())])


def _level(run: Run, count: int, in_memory: int | None = None) -> RunLevel:
    """``run`` cut into ``count`` parts on disk at index-key boundaries (part ``in_memory``
    kept in memory)."""
    cuts = [0]
    for at in np.linspace(0, len(run), count + 1)[1:-1].astype(int):
        cuts.append(int(np.searchsorted(run.index, run.index[at], side="left")))
    cuts.append(len(run))
    parts: list[Part] = []
    with forced_disk(block_bytes=512):
        for p, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            part = run.slice(lo, hi)
            parts.append(part if p == in_memory else spill_run("s", part))
    return RunLevel(parts)


def _cases() -> Iterator[tuple[str, KeyIndexer, pa.StructArray, pa.StructArray]]:
    keys = np.random.default_rng(7).permutation(6000)
    ints = pa.StructArray.from_arrays([pa.array(keys * 2)], fields=list(INT_KEY))
    strings = pa.StructArray.from_arrays(
        [pa.array([f"key-{k}" for k in keys * 2])], fields=list(STR_KEY)
    )
    plain = pa.StructArray.from_arrays([pa.array(keys), pa.array(keys * 0.5)], names=["a", "b"])
    text = pa.StructArray.from_arrays([pa.array([f"v{k}" for k in keys])], names=["t"])
    yield "exact keys, values as words", KeyIndexer(INT_KEY), ints, plain
    yield "exact keys, values through Arrow", KeyIndexer(INT_KEY), ints, text
    yield "hashed keys that collide", FewHashes(STR_KEY, 512), strings, plain


@pytest.mark.parametrize("case", list(_cases()), ids=lambda case: case[0])
@pytest.mark.parametrize("in_memory", [None, 5])
def test_a_level_answers_batch_lookups_as_the_same_rows_in_memory(
    case: tuple[str, KeyIndexer, pa.StructArray, pa.StructArray], in_memory: int | None
) -> None:
    _, indexer, keys, values = case
    run = Run.build(indexer, keys, values)[0]
    level = _level(run, 12, in_memory)
    probe_rows = np.random.default_rng(3).integers(0, len(keys), 3000)
    absent = pa.StructArray.from_arrays(
        [pa.array([None] * 10, keys.type.field(0).type)], fields=list(keys.type)
    )
    for probes in (keys.take(pa.array(probe_rows)), keys.slice(0, 40), absent):
        if keys.type == INT_KEY:  # odd integers lie between the keys: absent
            odd = pa.array(np.arange(1, 400, 2))
            probes = pa.concat_arrays(
                [probes, pa.StructArray.from_arrays([odd], fields=list(INT_KEY))]
            )
        index = indexer.index(probes)
        expected, expected_values = run.find(indexer, index, probes)
        for _ in range(2):  # the second lookup reads the field words the first learnt
            found, found_values = level.find(indexer, index, probes)
            assert found.tolist() == expected.tolist()
            assert found_values.equals(expected_values)


def _mapped(level: RunLevel) -> int:
    maps = Path("/proc/self/maps").read_text()
    return sum(part.path in maps for part in level.parts if isinstance(part, DiskRun))


def test_a_levels_files_stay_mapped_between_lookups_within_the_open_file_limit() -> None:
    """Each part's file is mapped once and kept (its footer read once, not at each lookup of
    each part); past the open-file limit the least recently used are unmapped, even those a
    lookup held while it ran, and every answer stays right."""
    indexer = KeyIndexer(INT_KEY)
    keys = pa.StructArray.from_arrays([pa.array(np.arange(0, 8000, 2))], fields=list(INT_KEY))
    values = pa.StructArray.from_arrays([pa.array(np.arange(4000))], names=["v"])
    level = _level(Run.build(indexer, keys, values)[0], 12)
    index = indexer.index(keys)
    saved = OPEN_RUNS.limit
    OPEN_RUNS.limit = 4
    try:
        for _ in range(2):
            found, found_values = level.find(indexer, index, keys)
            assert found.tolist() == list(range(4000))
            assert found_values.field("v").to_pylist() == list(range(4000))
            assert len(OPEN_RUNS) <= 4 and _mapped(level) <= 4
    finally:
        OPEN_RUNS.limit = saved
    for _ in range(2):
        found, _ = level.find(indexer, index, keys)
        assert found.tolist() == list(range(4000))
        assert _mapped(level) == 12


def _int_level(count: int) -> tuple[KeyIndexer, np.ndarray, pa.StructArray, RunLevel]:
    """40,000 int keys and plain values in a level of ``count`` parts on disk."""
    indexer = KeyIndexer(INT_KEY)
    keys = pa.StructArray.from_arrays([pa.array(np.arange(0, 80000, 2))], fields=list(INT_KEY))
    values = pa.StructArray.from_arrays([pa.array(np.arange(40000))], names=["v"])
    return indexer, indexer.index(keys), keys, _level(Run.build(indexer, keys, values)[0], count)


def _disk_parts(level: RunLevel) -> list[DiskRun]:
    return [part for part in level.parts if isinstance(part, DiskRun)]


@pytest.mark.parametrize("victim", [0, 1, 3])
def test_a_part_whose_file_is_shortened_is_refused_naming_it(victim: int) -> None:
    """A part's file cut short, its IPC footer still readable: the lookup raises naming that
    file (a read past its end used to land in the next part's map: wrong answers)."""
    indexer, index, keys, level = _int_level(4)
    parts = _disk_parts(level)
    for part in parts:
        OPEN_RUNS.close(part.path)
    path = Path(parts[victim].path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + data[-(64 << 10) :])
    with pytest.raises(StateStoreError, match="damaged") as raised:
        level.find(indexer, index, keys)
    assert raised.value.path == str(path)


def test_a_region_refuses_a_block_outside_its_own_file() -> None:
    """A table placing a block's index column past its file's end (the next map's memory
    through the span) is refused, naming the file."""
    _, _, _, level = _int_level(2)
    parts = _disk_parts(level)
    with contextlib.ExitStack() as held:
        files = [
            RunFile(held.enter_context(OPEN_RUNS.mapped(part.path)), *part.tables(), 0)
            for part in parts
        ]
        offsets, starts, fields = parts[0].tables()
        files[0] = RunFile(files[0].mapped, offsets, starts + len(files[0].mapped) // 8, fields, 0)
        with pytest.raises(StateStoreError, match="damaged") as raised:
            Region(files, parts[0].value_type, "s")
    assert raised.value.path == parts[0].path


def test_a_failed_lookups_view_keeps_the_maps_mapped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A lookup failing while it reads values through the span of several maps leaves that
    view in its traceback: closing the parts then warns and keeps them mapped (reading the
    view after an unmap would crash the process)."""
    indexer, index, keys, level = _int_level(4)
    level.find(indexer, index, keys)  # the field words learnt: values read through the span

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("failed while gathering")

    monkeypatch.setattr(pa, "array", fail)
    with pytest.raises(RuntimeError, match="gathering") as raised:
        level.find(indexer, index, keys)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="state_runtime.store"):
        for part in _disk_parts(level):
            OPEN_RUNS.close(part.path)
    assert sum("outlived its lookups" in r.getMessage() for r in caplog.records) == 4
    assert _mapped(level) == 4
    del raised
