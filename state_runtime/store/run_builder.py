"""One run built from rows that arrive a piece at a time, in memory or on local disk.

A snapshot read a record batch at a time (:mod:`state_runtime.store.snapshot_stream`) hands
its rows here. Pieces stay in memory while they fit the spill threshold (a quarter of the
budget, :mod:`state_runtime.store.disk_runs`); past it they stream into runs on disk. Rows
of a store keyed by one integer column come in index order and make a single run, written
once; rows in another order (a snapshot sorted by key, hashed keys) make one sorted run per
ordered stretch. Stretches on disk are merged :data:`FAN_IN` at a time as they pile up (a
tiered merge: each row is rewritten once per level), and what is left into one at the end.
Memory is a piece and a block of each run a merge reads, whatever the number of rows, and
open files stay within ``FAN_IN`` per level.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from state_runtime.store.disk_runs import LOCAL_DISK, Part
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_merges import merge_blocks
from state_runtime.store.run_writer import RunWriter, written
from state_runtime.store.sorted_runs import Run, concat

FAN_IN = 16
"""Stretches on disk merged at a time (see :meth:`RunBuilder._tier`)."""


class RunBuilder:
    """Rows added piece by piece, in any order; :meth:`finish` gives them as one run."""

    def __init__(
        self,
        indexer: KeyIndexer,
        store: object,
        key_type: pa.DataType,
        value_type: pa.DataType,
        expected_bytes: int,
    ) -> None:
        self._indexer = indexer
        self._store = store
        self._types = key_type, value_type
        self._expected = expected_bytes  # what local disk must have free for a spilled run
        self._pieces: list[Run] = []  # in memory, until they outgrow the threshold
        self._held = 0
        self._stretches: list[Part] = []  # finished stretches in index order each
        self._levels: list[int] = []  # of stretches on disk: how often merged
        self._writer: RunWriter | None = None  # the current stretch, once spilling
        self._last: int | None = None  # the current stretch's last index key
        self.rows = 0
        self.duplicates = 0
        """Rows dropped as another row's key (all of them once :meth:`finish` ran)."""

    def add(self, keys: pa.StructArray, values: pa.StructArray) -> None:
        """Rows in any order (the last of equal keys in one piece wins, and counts as a
        duplicate)."""
        piece, dropped = Run.build(self._indexer, keys, values)
        self.rows += len(keys)
        self.duplicates += dropped
        if not len(piece):
            return
        if self._last is not None and piece.index[0] <= self._last:
            self._close_stretch()  # out of order (or a key equal to the last): a new stretch
        self._last = int(piece.index[-1])
        if self._writer is not None:
            self._writer.add(piece)
            return
        self._pieces.append(piece)
        self._held += piece.nbytes
        if self._held > LOCAL_DISK.threshold():
            self._spill()

    def _spill(self) -> None:
        """From now on stretches go to disk: the finished ones and the current one."""
        self._stretches = [self._written(s.blocks()) for s in self._stretches]
        self._levels = [0] * len(self._stretches)
        self._tier()
        self._writer = RunWriter(self._store, *self._types, self._expected)
        for piece in self._pieces:
            self._writer.add(piece)
        self._pieces, self._held = [], 0

    def _written(self, blocks: Iterable[Run]) -> Part:
        return written(self._store, blocks, *self._types, self._expected, compaction=False)

    def _close_stretch(self, *, more: bool = True) -> None:
        if self._writer is not None:
            self._stretches.append(self._writer.finish(compaction=False))
            self._levels.append(0)
            self._tier()
            self._writer = RunWriter(self._store, *self._types, self._expected) if more else None
        elif self._pieces:
            self._stretches.append(concat(self._pieces, *self._types))
            self._pieces = []
        self._last = None

    def _tier(self) -> None:
        """Merge the last :data:`FAN_IN` stretches on disk into one while they are of one
        level (merged as often): at most ``FAN_IN`` runs open per level, each row rewritten
        once per level, and a merge holds a block of each of ``FAN_IN`` runs."""
        while len(self._levels) >= FAN_IN and len(set(self._levels[-FAN_IN:])) == 1:
            level = self._levels[-1]
            merged = self._written(merge_tree(self._indexer, self._stretches[-FAN_IN:]))
            del self._stretches[-FAN_IN:], self._levels[-FAN_IN:]
            self._stretches.append(merged)
            self._levels.append(level + 1)

    def finish(self) -> Part:
        """The rows as one run; :attr:`duplicates` then counts every key added more than
        once."""
        spilling = self._writer is not None
        self._close_stretch(more=False)
        stretches, self._stretches, self._levels = self._stretches, [], []
        if not stretches:
            result: Part = Run.empty(*self._types)
        elif len(stretches) == 1:
            result = stretches[0]
        elif not spilling:
            in_memory = [s for s in stretches if isinstance(s, Run)]
            result, _ = Run.build(
                self._indexer,
                pa.concat_arrays([s.keys for s in in_memory]),
                pa.concat_arrays([s.values for s in in_memory]),
            )
        else:
            result = self._written(merge_tree(self._indexer, stretches))
        self.duplicates = self.rows - len(result)
        return result

    def discard(self) -> None:
        """Drop what was built (a failed read); files on disk go with their runs."""
        if self._writer is not None:
            self._writer.discard()
            self._writer = None
        self._pieces, self._stretches, self._levels = [], [], []


def merge_tree(indexer: KeyIndexer, runs: Sequence[Part]) -> Iterator[Run]:
    """Runs in index order each (a later run wins a key) merged in one pass, block by block:
    a balanced tree of :func:`merge_blocks`, a block of each run in memory at a time."""
    if len(runs) == 1:
        return runs[0].blocks()
    mid = len(runs) // 2
    return merge_blocks(
        indexer,
        merge_tree(indexer, runs[:mid]),
        merge_tree(indexer, runs[mid:]),
        drop_removals=False,
    )
