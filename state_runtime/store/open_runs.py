"""The open files of runs on disk: at most :data:`MAX_OPEN_RUNS` descriptors in a process.

A :class:`~state_runtime.store.disk_runs.DiskRun` holds no file open: its blocks are read
through a reader that :data:`OPEN_RUNS` opens on first use and keeps among the most recently
used, and its batch lookups through a read-only memory map of the file kept the same way
(:class:`Mapped`: the map, its views and the file's IPC footer, made once, not at each lookup
of each part of a level). Past the limit the least recently used files are closed, their
readers and maps together (a map in use by a lookup is unmapped when that lookup ends). A
worker's runs on disk (every store's base and change levels, every cached version) are then
bounded by local disk only, never by the process's file descriptors (docs/state-on-disk.md,
"Open files").
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import threading
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

MAX_OPEN_RUNS = 256
"""Descriptors of run files a process keeps open at most (a reader and a map: one each)."""

WORD = np.dtype(np.int64)
"""An index key's word in a run file."""

log = logging.getLogger("state_runtime.store")


class Mapped:
    """A run file mapped read-only, with the views a batch lookup reads it through: its words
    of each type and a reader of its blocks (zero-copy record batches of the map)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as file:
            self.mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.whole = pa.py_buffer(self.mapping)
        self.reader = pa.ipc.open_file(self.whole)
        self._views: dict[np.dtype, np.ndarray] = {}
        self.users = 0
        self.closing = False

    def __len__(self) -> int:
        return len(self.mapping)

    @property
    def address(self) -> tuple[int, int]:
        """The map's address and length."""
        return self.whole.address, self.whole.size

    def words(self, dtype: np.dtype = WORD) -> np.ndarray:
        """The file as an array of ``dtype`` words (its length rounded down)."""
        view = self._views.get(dtype)
        if view is None:
            count = len(self.mapping) // dtype.itemsize
            view = self._views[dtype] = np.frombuffer(self.mapping, dtype=dtype, count=count)
        return view

    def advise(self, advice: int | None, span: tuple[int, int]) -> None:
        """``madvise`` over ``span`` (start, length) where the platform and the kernel have
        it (None: an advice the platform lacks): only advice, which changes what is
        resident, never an answer."""
        if advice is not None and hasattr(self.mapping, "madvise"):
            with contextlib.suppress(OSError):  # an advice the kernel does not know
                self.mapping.madvise(advice, *span)

    def close(self) -> None:
        """Drop the views, then unmap (at once unless an Arrow array still refers to it)."""
        self._views.clear()
        del self.reader, self.whole
        try:
            self.mapping.close()
        except BufferError:  # an Arrow array still refers to it: unmapped when collected
            log.warning("%s: a view of its memory map outlived its lookups", self.path)


class _Reader:
    """One run file's reader and map, each opened on first use; ``closed`` once evicted
    (reads then reopen)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.file: pa.OSFile | None = None  # plain reads: the blocks we drop leave memory
        self.reader: pa.ipc.RecordBatchFileReader | None = None
        self.mapped: Mapped | None = None
        self.closed = False

    @property
    def descriptors(self) -> int:
        return (self.file is not None) + (self.mapped is not None)

    def batch(self, b: int) -> pa.RecordBatch:
        """Record batch ``b`` read from the file (the caller holds :attr:`lock`)."""
        if self.reader is None:
            self.file = pa.OSFile(self.path, "rb")
            self.reader = pa.ipc.open_file(self.file)
        return self.reader.get_batch(b)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.file is not None:
                self.file.close()
            mapped = self.mapped
            if mapped is not None and not mapped.users:
                mapped.close()
            elif mapped is not None:
                mapped.closing = True  # the lookup using it unmaps it


class OpenRuns:
    """Readers and maps of run files, least recently used closed first past :attr:`limit`
    descriptors."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Reader] = OrderedDict()
        self.limit = MAX_OPEN_RUNS

    def __len__(self) -> int:
        """The descriptors open."""
        with self._lock:
            return sum(reader.descriptors for reader in self._open.values())

    def _reader(self, path: str, opening: str) -> _Reader:
        """The reader of ``path``, made if need be; if its ``opening`` ("file" or "mapped")
        is not open yet, the least recently used others are closed past the limit (counting
        the descriptor about to open)."""
        evicted: list[_Reader] = []
        with self._lock:
            reader = self._open.get(path)
            if reader is None:
                reader = self._open[path] = _Reader(path)
            else:
                self._open.move_to_end(path)
            if getattr(reader, opening) is None:
                held = 1 + sum(r.descriptors for r in self._open.values())
                while held > max(2, self.limit) and len(self._open) > 1:
                    old = self._open.popitem(last=False)[1]
                    held -= old.descriptors
                    evicted.append(old)
        for old in evicted:
            old.close()
        return reader

    def batch(self, path: str, b: int) -> pa.RecordBatch:
        """Record batch ``b`` of the run file ``path``."""
        while True:
            reader = self._reader(path, "file")
            with reader.lock:
                if not reader.closed:
                    return reader.batch(b)

    @contextlib.contextmanager
    def mapped(self, path: str) -> Iterator[Mapped]:
        """The run file ``path`` mapped, kept mapped while the caller uses it."""
        while True:
            reader = self._reader(path, "mapped")
            with reader.lock:
                if reader.closed:
                    continue
                if reader.mapped is None:
                    reader.mapped = Mapped(path)
                mapped = reader.mapped
                mapped.users += 1
                break
        try:
            yield mapped
        finally:
            with reader.lock:
                mapped.users -= 1
                if mapped.closing and not mapped.users:
                    mapped.close()

    def close(self, path: str) -> None:
        """Close ``path``'s reader and map if open (its run is dropped)."""
        with self._lock:
            reader = self._open.pop(path, None)
        if reader is not None:
            reader.close()


OPEN_RUNS = OpenRuns()
