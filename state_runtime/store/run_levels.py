"""Runs whose index ranges do not overlap, read as one run: a *level*.

Two runs whose index ranges do not overlap hold no key in common (equal keys have equal index
keys), so overlaying one with the other needs no merge: their rows side by side, in index
order, are the result. A :class:`RunLevel` keeps such runs (its *parts*, on local disk or in
memory) as they are and answers as one run: a probe goes to the one part whose range holds its
index key (a binary search on the parts' first and last index keys), blocks come part after
part. Nothing is written to make one. :mod:`~state_runtime.store.run_merges` builds them: a
running aggregation's chunks of whole keys, in key order, go to disk once each and are never
rewritten against each other (docs/state-on-disk.md, "Write amplification").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from state_runtime.store.arrow_rows import Row
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun, DiskStats, Part, find_on_disk
from state_runtime.store.fences import holding, overlapping
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_writer import spill_run
from state_runtime.store.sorted_runs import Run, concat
from state_runtime.store.store_metrics import DiskMetrics


class RunLevel:
    """Runs in index order whose index ranges do not overlap (at least two, one on disk), as
    one run (see the module)."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = tuple(parts)
        spans = [span(part) for part in self.parts]
        self._firsts = np.array([s[0] for s in spans], dtype=np.int64)
        self._lasts = np.array([s[1] for s in spans], dtype=np.int64)
        self._offsets = np.cumsum([0, *(len(part) for part in self.parts)], dtype=np.int64)
        assert len(self.parts) >= 2 and bool(np.all(self._firsts[1:] > self._lasts[:-1]))
        disk = next(part for part in self.parts if isinstance(part, DiskRun))
        self.store = disk.store

    on_disk = True

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def nbytes(self) -> int:
        """Bytes held in memory: the parts' own and the level's fences."""
        fences = self._firsts.nbytes + self._lasts.nbytes + self._offsets.nbytes
        return sum(part.nbytes for part in self.parts) + int(fences)

    @property
    def file_bytes(self) -> int:
        """Bytes of the parts' files on local disk."""
        return sum(part.file_bytes for part in self.parts if isinstance(part, DiskRun))

    @property
    def removals(self) -> int:
        return sum(part.removals for part in self.parts)

    @property
    def key_type(self) -> pa.DataType:
        return self.parts[0].key_type

    @property
    def value_type(self) -> pa.DataType:
        return self.parts[0].value_type

    @property
    def first(self) -> int:
        return int(self._firsts[0])

    @property
    def last(self) -> int:
        return int(self._lasts[-1])

    def blocks(self) -> Iterator[Run]:
        """Every block in index order: the parts' blocks, part after part."""
        for part in self.parts:
            yield from part.blocks()

    def between(self, lo: int, hi: int) -> Run:
        """The rows whose index key is in ``[lo, hi]``, from the parts whose range meets it."""
        parts = [
            self.parts[p].between(lo, hi) for p in overlapping(self._firsts, self._lasts, lo, hi)
        ]
        return concat(parts, self.key_type, self.value_type)

    def find(
        self,
        indexer: KeyIndexer,
        index: np.ndarray,
        keys: pa.StructArray,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, pa.StructArray]:
        """For each probe, its row in this level or -1, and the values of the probes found, in
        probe order: the parts on disk that probes fall in answer together, in one search
        (:func:`~state_runtime.store.disk_runs.find_on_disk`), each part in memory on its own."""
        rows = np.arange(len(index)) if rows is None else rows
        part_of = holding(self._firsts, self._lasts, index)
        touched = np.unique(part_of[part_of >= 0]).tolist()
        on_disk = [p for p in touched if isinstance(self.parts[p], DiskRun)]
        found = np.full(len(index), -1, dtype=np.int64)
        probes: list[np.ndarray] = []
        values: list[pa.Array] = []
        if on_disk:
            runs = [self.parts[p] for p in on_disk]
            first_rows = self._offsets[on_disk].tolist()
            found, taken = find_on_disk(runs, first_rows, indexer, (index, keys, rows))
            probes.append(np.flatnonzero(found >= 0))
            values.append(taken)
        for p in touched:
            if isinstance(self.parts[p], DiskRun):
                continue
            mine = np.flatnonzero(part_of == p)
            pos, found_values = self.parts[p].find(indexer, index[mine], keys, rows[mine])
            hit = pos >= 0
            found[mine[hit]] = pos[hit] + self._offsets[p]
            probes.append(mine[hit])
            values.append(found_values)
        if not probes:
            return found, pa.array([], type=self.value_type)
        if len(probes) == 1:
            return found, values[0]
        by_probe = np.argsort(np.concatenate(probes), kind="stable")
        return found, pa.concat_arrays(values).take(pa.array(by_probe))

    def position_of(self, indexer: KeyIndexer, h: int, key: tuple[object, ...]) -> int:
        """The row of one Python key (with index key ``h``) or -1."""
        p = int(holding(self._firsts, self._lasts, np.array([h], dtype=np.int64))[0])
        if p < 0:
            return -1
        i = self.parts[p].position_of(indexer, h, key)
        return -1 if i < 0 else i + int(self._offsets[p])

    def value_at(self, i: int) -> Row | None:
        p = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return self.parts[p].value_at(i - int(self._offsets[p]))


AnyRun = Run | DiskRun | RunLevel
"""A run in memory, on local disk, or a level of those."""


def span(run: AnyRun) -> tuple[int, int]:
    """A run's first and last index key (not empty)."""
    if isinstance(run, Run):
        return int(run.index[0]), int(run.index[-1])
    return run.first, run.last


def parts(run: AnyRun) -> tuple[Part, ...]:
    """A run's parts in index order: a level's, else the run itself (none if empty)."""
    if isinstance(run, RunLevel):
        return run.parts
    return (run,) if len(run) else ()


def memory_held(runs: Sequence[AnyRun]) -> int:
    """Bytes of the rows that ``runs`` hold in memory: runs and levels' parts in memory."""
    return sum(p.nbytes for run in runs for p in parts(run) if isinstance(p, Run))


def held_bytes(run: AnyRun) -> int:
    """Bytes of a run's rows, on disk or in memory."""
    return sum(p.file_bytes if isinstance(p, DiskRun) else p.nbytes for p in parts(run))


def disk_metrics(runs: tuple[AnyRun, ...], earlier: DiskStats) -> DiskMetrics:
    """The figures of a version made of ``runs`` (bytes in memory, bytes of its files on
    local disk) and this process's activity since ``earlier``."""
    return dataclasses.replace(
        LOCAL_DISK.activity_since(earlier),
        resident_bytes=sum(run.nbytes for run in runs),
        local_disk_bytes=sum(run.file_bytes for run in runs if not isinstance(run, Run)),
    )


def damaged(runs: Sequence[AnyRun]) -> bool:
    """Whether a file of ``runs`` on local disk is damaged (:meth:`DiskRun.is_damaged`)."""
    return any(isinstance(p, DiskRun) and p.is_damaged() for run in runs for p in parts(run))


def spilled(store: object | None, run: AnyRun) -> AnyRun:
    """``run``, on disk if it is in memory, larger than the threshold and ``store`` is set."""
    return spill_run(store, run) if isinstance(run, Run) else run
