"""Writing a run to a file on local disk (:class:`~state_runtime.store.disk_runs.DiskRun`
reads it): its rows in index order, a block at a time, with the free space checked first and a
full disk turned into :class:`~state_runtime.errors.LocalDiskFull` (docs/state-on-disk.md)."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from state_runtime.errors import InvalidArgument, LocalDiskFull, StateStoreError
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun, Part
from state_runtime.store.mapped_probes import index_words
from state_runtime.store.sorted_runs import Run, concat


class RunWriter:
    """Writes a run to local disk from its rows in index order, given a piece at a time."""

    def __init__(
        self, store: object, key_type: pa.DataType, value_type: pa.DataType, needed: int
    ) -> None:
        if _has_dictionary(key_type) or _has_dictionary(value_type):
            raise InvalidArgument("a run on disk cannot hold dictionary types", store=store)
        LOCAL_DISK.check_free(store, needed)
        self._store = store
        self._needed = needed
        self._key_type, self._value_type = key_type, value_type
        self.path = os.path.join(LOCAL_DISK.directory, f"{uuid.uuid4().hex}.arrow")
        schema = pa.schema([("index", pa.int64()), ("key", key_type), ("value", value_type)])
        self._buffer: list[Run] = []
        self._buffered = 0
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        self._offsets = [0]
        self._messages: list[int] = []  # where each block's IPC message starts in the file
        self._removals = 0
        try:
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = pa.ipc.new_file(self._sink, schema)
        except OSError as e:
            self._failed(e)

    def add(self, piece: Run) -> None:
        """Rows following every row added so far in index order."""
        if not len(piece):
            return
        self._buffer.append(piece)
        self._buffered += piece.nbytes
        if self._buffered >= 2 * LOCAL_DISK.block_bytes:
            self._cut(final=False)

    def _cut(self, *, final: bool) -> None:
        """Write whole blocks of the buffer (all of it if ``final``)."""
        if not self._buffer:
            return
        rows = concat(self._buffer, self._key_type, self._value_type)
        per_row = max(1, rows.nbytes // max(1, len(rows)))
        step = max(1, LOCAL_DISK.block_bytes // per_row)
        start = 0
        while len(rows) - start > (0 if final else step):
            stop = min(len(rows), start + step)
            # Equal index keys stay in one block.
            stop = int(np.searchsorted(rows.index, rows.index[stop - 1], side="right"))
            if not final and stop == len(rows):
                break
            self._write(rows.slice(start, stop))
            start = stop
        self._buffer = [rows.slice(start, len(rows))] if start < len(rows) else []
        self._buffered = sum(r.nbytes for r in self._buffer)

    def _write(self, block: Run) -> None:
        batch = pa.record_batch(
            [pa.array(block.index, type=pa.int64()), block.keys, block.values],
            names=["index", "key", "value"],
        )
        try:
            self._messages.append(self._sink.tell())
            self._writer.write_batch(batch)
        except OSError as e:
            self._failed(e)
        self._firsts.append(int(block.index[0]))
        self._lasts.append(int(block.index[-1]))
        self._offsets.append(self._offsets[-1] + len(block))
        self._removals += block.removals

    def _failed(self, error: OSError) -> None:
        self.discard()
        raise_if_full(error, "a run of this store's state", self._store, self._needed, self.path)
        raise error

    def discard(self) -> None:
        """Close and delete the file (idempotent)."""
        for closing in ("_writer", "_sink"):
            if hasattr(self, closing):
                with contextlib.suppress(OSError, pa.ArrowException):
                    getattr(self, closing).close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def finish(self, *, compaction: bool) -> Part:
        """The run written (an empty in-memory run if no rows came)."""
        self._cut(final=True)
        try:
            self._writer.close()
            self._sink.close()
        except OSError as e:
            self._failed(e)
        if not self._firsts:
            os.unlink(self.path)
            return Run.empty(self._key_type, self._value_type)
        firsts = np.array(self._firsts, dtype=np.int64)
        try:
            starts = index_words(self.path, self._messages, firsts)
        except (OSError, ValueError) as e:
            self.discard()
            raise StateStoreError(
                f"a run file just written is not as written ({e})",
                store=self._store,
                path=self.path,
            ) from e
        size = os.path.getsize(self.path)
        LOCAL_DISK.count_file(size, compaction=compaction)
        return DiskRun(
            self.path,
            self._store,
            firsts,
            np.array(self._lasts, dtype=np.int64),
            np.array(self._offsets, dtype=np.int64),
            starts,
            self._removals,
            size,
            (self._key_type, self._value_type),
        )


def _has_dictionary(data_type: pa.DataType) -> bool:
    """Whether ``data_type`` or a type nested in it is dictionary-encoded."""
    return pa.types.is_dictionary(data_type) or any(
        _has_dictionary(data_type.field(i).type) for i in range(data_type.num_fields)
    )


def raise_if_full(error: OSError, what: str, store: object, needed: int, path: str) -> None:
    """LocalDiskFull if ``error`` says the local disk is full (writing ``what``)."""
    if error.errno == errno.ENOSPC or "No space left" in str(error):
        raise LocalDiskFull(
            f"local disk filled up while writing {what} ({error})",
            needed=needed,
            free=LOCAL_DISK.free_bytes(),
            store=store,
            path=path,
        ) from error


def written(
    store: object,
    pieces: Iterable[Run],
    key_type: pa.DataType,
    value_type: pa.DataType,
    needed: int,
    *,
    compaction: bool,
) -> Part:
    """The rows of ``pieces`` (in index order) as a run on disk."""
    writer = RunWriter(store, key_type, value_type, needed)
    try:
        for piece in pieces:
            writer.add(piece)
    except BaseException:
        writer.discard()
        raise
    return writer.finish(compaction=compaction)


def spill_run(store: object | None, run: Run) -> Part:
    """``run``, on disk if it is larger than the threshold and ``store`` is set."""
    if store is None or run.nbytes <= LOCAL_DISK.threshold() or not len(run):
        return run
    return written(store, [run], run.keys.type, run.values.type, run.nbytes, compaction=False)
