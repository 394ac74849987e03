"""The open files of runs on disk: at most :data:`MAX_OPEN_RUNS` in a process.

A :class:`~state_runtime.store.disk_runs.DiskRun` holds no file open: its blocks are read
through a reader that :data:`OPEN_RUNS` opens on first use and keeps among the most recently
used, closing the least recently used past the limit. A worker's runs on disk (every store's
base and change levels, every cached version) are then bounded by local disk only, never by
the process's file descriptors (docs/state-on-disk.md, "Open files").
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

MAX_OPEN_RUNS = 256
"""Run files a process keeps open at most."""


class _Reader:
    """One run file open for reading; ``closed`` once evicted (reads then reopen)."""

    def __init__(self, path: str) -> None:
        self.lock = threading.Lock()
        self.file = pa.OSFile(path, "rb")  # plain reads: the blocks we drop leave memory
        self.reader = pa.ipc.open_file(self.file)
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.file.close()


class OpenRuns:
    """Readers of run files, least recently used closed first past :attr:`limit`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Reader] = OrderedDict()
        self.limit = MAX_OPEN_RUNS

    def __len__(self) -> int:
        return len(self._open)

    def _reader(self, path: str) -> _Reader:
        """The open reader of ``path``, opened if need be (evicting past the limit)."""
        evicted: list[_Reader] = []
        with self._lock:
            reader = self._open.get(path)
            if reader is None:
                reader = self._open[path] = _Reader(path)
                while len(self._open) > max(1, self.limit):
                    evicted.append(self._open.popitem(last=False)[1])
            else:
                self._open.move_to_end(path)
        for old in evicted:
            old.close()
        return reader

    def batch(self, path: str, b: int) -> pa.RecordBatch:
        """Record batch ``b`` of the run file ``path``."""
        while True:
            reader = self._reader(path)
            with reader.lock:
                if not reader.closed:
                    return reader.reader.get_batch(b)

    def close(self, path: str) -> None:
        """Close ``path``'s reader if it is open (its run is dropped)."""
        with self._lock:
            reader = self._open.pop(path, None)
        if reader is not None:
            reader.close()


OPEN_RUNS = OpenRuns()
