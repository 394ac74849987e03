"""One state partition's input rows in a task, as Spark sends them, and the pieces the update
function gets.

An operator whose update is key-local (:attr:`StatefulOperator.key_local`: every row of a key
in one call, keys in any grouping) gets a large input in pieces instead of whole: past
:data:`SPILL_ROWS` rows the rows are sorted by the store's index key (``KeyIndexer``) and
written to a file in the worker's local folder (``STATE_LOCAL_DIR``), and at the end the
files are merged a block at a time (at most :data:`FAN_IN` files at once: more are merged in
groups into fewer files first) into pieces of whole keys in index order of about
:data:`PIECE_ROWS` rows. So the task holds a piece, not the partition's input nor its sort
order, and a running aggregation's change runs come out disjoint in index order, each
written once (docs/state-on-disk.md). Any other operator, or an input that never passes
:data:`SPILL_ROWS`, gets its rows in one table, as before.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from state_runtime.identity import StoreId
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_writer import raise_if_full

SPILL_ROWS = 1 << 17
"""Rows of a partition's input held in memory before they go to a sorted file."""
PIECE_ROWS = 1 << 17
"""Rows of a piece the update gets at least (past them, the piece ends at a merge step)."""
BLOCK_ROWS = 1 << 13
"""Rows of a file's record batch (never splitting an index key): the merge holds one per
file, so the pieces grow past :data:`PIECE_ROWS` by at most this much per file."""
FAN_IN = 64
"""Files the merge reads at once: past them, the earliest :data:`FAN_IN` files are first
merged into one (their rows written again), so the merge holds at most this many open files
and blocks, and each of its steps looks at as many blocks."""
INDEX = "__state_index"
SPILLED = "the task's spilled input"
"""What a disk-full error says it was writing."""


class PartitionInput:
    """A partition's rows: kept in memory, or (``key_type`` given: the operator is
    key-local) spilled past :data:`SPILL_ROWS` rows to sorted files; ``store`` (the
    operator's main store in this partition) is what a disk-full error names."""

    def __init__(
        self, key_columns: Sequence[str], key_type: pa.StructType | None, store: StoreId
    ) -> None:
        self._store = store
        self._key_columns = list(key_columns)
        self._indexer = None if key_type is None else KeyIndexer(key_type)
        self._held: list[pa.RecordBatch] = []
        self._held_rows = 0
        self._files: list[tuple[str, int]] = []
        self._schema = pa.schema([])
        """The files' schema (the rows' and the index key), set by the first spill."""
        self.num_rows = 0
        self.spilled_bytes = 0
        """Bytes of the files the rows went to so far."""

    def add(self, rows: pa.RecordBatch) -> None:
        self._held.append(rows)
        self._held_rows += rows.num_rows
        self.num_rows += rows.num_rows
        if self._indexer is not None and self._held_rows >= SPILL_ROWS:
            self._spill()

    def pieces(self) -> Iterator[pa.Table]:
        """The rows: one table (the first :meth:`add` made one batch at least), or pieces
        of whole keys from the sorted files, deleted once read or the pieces dropped."""
        if not self._files:
            held, self._held = self._held, []
            yield pa.Table.from_batches(held)
            return
        try:
            if self._held:
                self._spill()
            while len(self._files) > FAN_IN:
                self._combine()
            yield from _merged(self._files, keep_index=False)
        finally:
            self.discard()

    def discard(self) -> None:
        """Delete the sorted files (the pieces were read, or never will be: a failed task)."""
        for path, size in self._files:
            LOCAL_DISK.forget_file(path, size)
        self._files, self._held = [], []

    def _spill(self) -> None:
        """The held rows, sorted by index key, into a file of blocks of whole index keys."""
        assert self._indexer is not None
        table = pa.Table.from_batches(self._held)
        self._held, self._held_rows = [], 0
        key_type = self._indexer.type
        keys = pa.StructArray.from_arrays(
            [
                table.column(c).combine_chunks().cast(key_type.field(i).type)
                for i, c in enumerate(self._key_columns)
            ],
            fields=list(key_type),
        )
        index = self._indexer.index(keys)
        del keys
        order = np.argsort(index, kind="stable")
        index = index[order]
        table = table.take(pa.array(order)).append_column(INDEX, pa.array(index))
        del index, order
        self._schema = table.schema
        self._files.append(self._written([table], table.nbytes))

    def _combine(self) -> None:
        """One pass: each run of :data:`FAN_IN` consecutive files merged into one, in their
        place (rows of a key stay in the order they came)."""
        files, done = self._files, []
        for start in range(0, len(files), FAN_IN):
            group = files[start : start + FAN_IN]
            if len(group) == 1:
                done += group
                continue
            self._files = done + files[start + FAN_IN :]  # the group is deleted below
            try:
                steps = (_sorted(t) for t in _merged(group, keep_index=True))
                done.append(self._written(steps, sum(s for _, s in group)))
            finally:
                for path, size in group:
                    LOCAL_DISK.forget_file(path, size)
        self._files = done

    def _written(self, tables: Iterable[pa.Table], needed: int) -> tuple[str, int]:
        """``tables`` (rows in index order, each ending at an index key's end) in a new file
        of blocks of whole index keys; its path and size."""
        LOCAL_DISK.check_free(self._store, needed, SPILLED)
        path = os.path.join(LOCAL_DISK.directory, f"input-{uuid.uuid4().hex}.arrow")
        try:
            with contextlib.ExitStack() as stack:
                sink = stack.enter_context(pa.OSFile(path, "wb"))
                writer = stack.enter_context(pa.ipc.new_file(sink, self._schema))
                for table in tables:
                    for start, stop in _blocks(table.column(INDEX).to_numpy()):
                        writer.write_table(table.slice(start, stop - start))
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            if isinstance(e, OSError):
                raise_if_full(e, SPILLED, self._store, needed, path)
            raise
        size = os.path.getsize(path)
        LOCAL_DISK.count_file(size, compaction=False)
        self.spilled_bytes += size
        return path, size


def _sorted(table: pa.Table) -> pa.Table:
    """A merge step's rows (each file's in index order, one file after another) in index
    order, rows of one index key in the order they were."""
    return table.take(pa.array(np.argsort(table.column(INDEX).to_numpy(), kind="stable")))


def _blocks(index: np.ndarray) -> list[tuple[int, int]]:
    """``[start, stop)`` of about :data:`BLOCK_ROWS` rows, never splitting an index key."""
    ranges, start, n = [], 0, len(index)
    while start < n:
        stop = min(start + BLOCK_ROWS, n)
        if stop < n:
            stop = int(np.searchsorted(index, index[stop - 1], side="right"))
        ranges.append((start, stop))
        start = stop
    return ranges


def _merged(files: Sequence[tuple[str, int]], *, keep_index: bool) -> Iterator[pa.Table]:
    """The files' rows in index order, in pieces of whole index keys (hence whole keys): each
    step takes, from every file's current block, the rows up to the smallest of the blocks'
    last index keys (no later block holds one of those: blocks never split an index key)."""
    with contextlib.ExitStack() as stack:
        readers = [pa.ipc.open_file(stack.enter_context(pa.OSFile(p))) for p, _ in files]
        yield from _steps(readers, keep_index)


def _steps(readers: Sequence[pa.ipc.RecordBatchFileReader], keep_index: bool) -> Iterator[pa.Table]:
    position = [0] * len(readers)
    current = [r.get_batch(0) if r.num_record_batches else None for r in readers]
    piece: list[pa.RecordBatch] = []
    rows = 0
    while any(b is not None for b in current):
        bound = min(_last(b) for b in current if b is not None)
        for i, block in enumerate(current):
            if block is None:
                continue
            index = block.column(INDEX).to_numpy()
            stop = int(np.searchsorted(index, bound, side="right"))
            if stop:
                taken = block.slice(0, stop)
                piece.append(taken if keep_index else taken.drop_columns([INDEX]))
                rows += stop
            if stop < block.num_rows:
                current[i] = block.slice(stop)
            else:
                position[i] += 1
                more = position[i] < readers[i].num_record_batches
                current[i] = readers[i].get_batch(position[i]) if more else None
        if rows >= PIECE_ROWS:
            yield pa.Table.from_batches(piece)
            piece, rows = [], 0
    if piece:
        yield pa.Table.from_batches(piece)


def _last(block: pa.RecordBatch) -> int:
    column = block.column(INDEX)
    return int(column[len(column) - 1].as_py())
