"""Sorted runs on local disk, read a block at a time: state larger than memory.

A run larger than a quarter of the memory budget (``STATE_CACHE_BYTES``) is written to a file
on local disk (``STATE_LOCAL_DIR``, default the system's temporary folder): an Arrow IPC file
of record batches (*blocks*, about :data:`BLOCK_BYTES` each) holding the index key, the key
and the value columns, in index order. Equal index keys never straddle two blocks. In memory a
:class:`DiskRun` keeps only its fence index: each block's first and last index key and first
row. A lookup finds a probe's block by a binary search on the fences, then binary-searches in
the block; blocks come through one process-wide :class:`BlockCache` of a quarter of the
budget. Scans and merges read blocks in order, one at a time, outside the cache. A run holds
no file open: its reads go through a process-wide set of at most 256 open readers
(:mod:`~state_runtime.store.open_runs`). The files
are a cache of what storage holds: they are deleted when their run is dropped, and the folder
at exit or, when the process was killed, by the next worker to make its folder there
(:mod:`~state_runtime.store.local_folder`); a lost worker rebuilds them from snapshots and
deltas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from state_runtime.errors import LocalDiskFull, LocalRunDamaged
from state_runtime.settings import WorkerSettings
from state_runtime.store.arrow_rows import Row
from state_runtime.store.fences import holding, overlapping
from state_runtime.store.field_words import FieldWords
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.local_folder import make_worker_folder
from state_runtime.store.mapped_probes import find_mapped
from state_runtime.store.mapped_region import Region, RunFile
from state_runtime.store.open_runs import OPEN_RUNS, Mapped
from state_runtime.store.sorted_runs import Run, concat, run_of
from state_runtime.store.store_metrics import DiskMetrics

BLOCK_BYTES = 64 << 10
"""The size a block of a run on disk aims at."""

SPILL_FRACTION = 4
"""A run larger than 1/SPILL_FRACTION of the budget goes to disk; the block cache holds as
much."""

MAP_BYTES = 8 << 20
"""Bytes of a run file a batch lookup may map at once whatever the budget: a fixed part of a
worker's overhead, so that a small budget does not split a lookup into many groups."""


@dataclass
class DiskStats:
    """What local disk did in this process (counters only grow, except ``local_disk_bytes``)."""

    local_disk_bytes: int = 0
    bytes_written: int = 0
    compaction_bytes: int = 0
    block_cache_hits: int = 0
    block_cache_misses: int = 0
    block_cache_bytes: int = 0


class LocalDisk:
    """The folder of this process's runs on disk, when a run goes there, and the counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._directory: str | None = None
        self._parent: str | None = None
        self._pid = os.getpid()
        self.spill_bytes: int | None = None
        """If set, the run size past which runs spill (tests force disk with 0)."""
        self.block_bytes = BLOCK_BYTES
        self.map_bytes = MAP_BYTES
        """The least a batch lookup maps at once (tests of the tiny budget set 0)."""
        self.budget: Callable[[], int] = lambda: WorkerSettings.from_env().cache_bytes
        """The process's memory budget (:mod:`state_runtime.store.cache` sets its own)."""
        self.stats = DiskStats()
        self.damaged: set[str] = set()
        """Run files found missing, short or unreadable: a cached version holding one is not
        served again (:meth:`~state_runtime.store.cache.VersionCache.get`)."""
        self._released: deque[tuple[str, int]] = deque()
        """Files of runs no longer held, deleted at the next :meth:`sweep`: a run's finalizer
        may run in a garbage collection inside any allocation, also one made while this
        thread holds a lock that deleting the file takes, so it only appends here (atomic)."""

    @property
    def directory(self) -> str:
        """This process's folder of runs, made on first use under the parent folder: the one
        :meth:`set_directory` gave, else ``STATE_LOCAL_DIR``, else the temporary folder."""
        self.sweep()  # before a run is written there
        with self._lock:
            if self._directory is None or self._pid != os.getpid():  # a forked child: its own
                parent = self._parent or os.environ.get("STATE_LOCAL_DIR") or None
                self._directory, self._pid = make_worker_folder(parent), os.getpid()
            return self._directory

    def set_directory(self, parent: str | None) -> None:
        """Put the runs written from now on in a new folder under ``parent`` (None: the
        default)."""
        with self._lock:
            self._directory = None
            self._parent = parent

    def threshold(self) -> int:
        """Bytes past which a run goes to disk."""
        if self.spill_bytes is not None:
            return self.spill_bytes
        return self.budget() // SPILL_FRACTION

    def map_window(self) -> int:
        """Bytes of a run file a batch lookup maps at once at most: the threshold, and at
        least :attr:`map_bytes` (:mod:`~state_runtime.store.mapped_probes`)."""
        return max(self.threshold(), self.map_bytes)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.directory).free

    def check_free(
        self, store: object, needed: int, what: str = "a run of this store's state"
    ) -> None:
        """LocalDiskFull unless the folder has ``needed`` bytes free (to write ``what``)."""
        free = self.free_bytes()
        if free < needed:
            raise LocalDiskFull(
                f"local disk cannot hold {what}",
                needed=needed,
                free=free,
                store=store,
                path=self.directory,
            )

    def release(self, path: str, size: int) -> None:
        """``path``'s run is no longer held: its file goes at the next :meth:`sweep`."""
        self._released.append((path, size))

    def sweep(self) -> None:
        """Close and delete the files of runs released since the last sweep (called with no
        lock of this module or :mod:`~state_runtime.store.open_runs` held: before a run file
        is written, and when the figures are read)."""
        while self._released:
            try:
                path, size = self._released.popleft()
            except IndexError:  # another thread took the last one
                return
            OPEN_RUNS.close(path)
            self.forget_file(path, size)

    def forget_file(self, path: str, size: int) -> None:
        """Delete the file of a run no longer held, and its cached blocks."""
        BLOCKS.drop(path)
        with self._lock:
            self.stats.local_disk_bytes -= size
            self.damaged.discard(path)
        with contextlib.suppress(FileNotFoundError):  # the folder went at exit first
            os.unlink(path)

    def damage(self, run: DiskRun, reason: str) -> LocalRunDamaged:
        """The error for ``run``'s file found damaged (``reason``), which is remembered so that
        no cached version holding it is served again and a retry loads from storage."""
        self.mark_damaged(run.path)
        reason = " ".join(reason.split())  # one line: the error's text is parsed back
        return LocalRunDamaged(
            f"a run file on local disk is damaged: {reason}; its versions are dropped from "
            "this worker's cache and a retry loads the store from storage",
            store=run.store,
            path=run.path,
        )

    def mark_damaged(self, path: str) -> None:
        """Remember ``path`` as damaged (:attr:`damaged`)."""
        with self._lock:
            self.damaged.add(path)

    def count_block_reads(self, blocks: int) -> None:
        """Count blocks a batch lookup read from their files (block-cache misses)."""
        with self._lock:
            self.stats.block_cache_misses += blocks

    def count_file(self, size: int, *, compaction: bool) -> None:
        """Count a run file just written."""
        with self._lock:
            self.stats.local_disk_bytes += size
            self.stats.bytes_written += size
            if compaction:
                self.stats.compaction_bytes += size

    def snapshot(self) -> DiskStats:
        """A copy of the counters now (the runs released until now deleted first)."""
        self.sweep()
        with self._lock:
            return dataclasses.replace(self.stats)

    def activity_since(self, earlier: DiskStats) -> DiskMetrics:
        """What this process's lookups and merges did since ``earlier`` (a :meth:`snapshot`):
        block-cache hits and misses, compaction bytes (the sizes are left 0)."""
        now = self.snapshot()
        return DiskMetrics(
            block_cache_hits=now.block_cache_hits - earlier.block_cache_hits,
            block_cache_misses=now.block_cache_misses - earlier.block_cache_misses,
            compaction_bytes=now.compaction_bytes - earlier.compaction_bytes,
        )


LOCAL_DISK = LocalDisk()


class BlockCache:
    """Blocks of runs on disk, least recently used first out, within a quarter of the budget."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[str, int], tuple[Run, int]] = OrderedDict()
        self._used = 0

    def get(self, path: str, block: int) -> Run | None:
        with self._lock:
            found = self._blocks.get((path, block))
            if found is None:
                LOCAL_DISK.stats.block_cache_misses += 1
                return None
            self._blocks.move_to_end((path, block))
            LOCAL_DISK.stats.block_cache_hits += 1
            return found[0]

    def put(self, path: str, block: int, run: Run, size: int, capacity: int) -> None:
        with self._lock:
            if (path, block) in self._blocks or size > capacity:
                return
            self._blocks[(path, block)] = (run, size)
            self._used += size
            while self._used > capacity:
                self._used -= self._blocks.popitem(last=False)[1][1]
            LOCAL_DISK.stats.block_cache_bytes = self._used

    def drop(self, path: str) -> None:
        with self._lock:
            for key in [k for k in self._blocks if k[0] == path]:
                self._used -= self._blocks.pop(key)[1]
            LOCAL_DISK.stats.block_cache_bytes = self._used


BLOCKS = BlockCache()


class DiskRun:
    """A run in a file on local disk; in memory only its fence index (see the module)."""

    on_disk = True

    def __init__(
        self,
        path: str,
        store: object,
        firsts: np.ndarray,
        lasts: np.ndarray,
        offsets: np.ndarray,
        starts: np.ndarray,
        removals: int,
        file_bytes: int,
        types: tuple[pa.DataType, pa.DataType],
    ) -> None:
        self.path = path
        self.store = store
        self._firsts = firsts  # first index key of each block
        self._lasts = lasts  # last index key of each block
        self._offsets = offsets  # first row of each block, then the row count
        self._starts = starts  # where each block's index column is in the file, in words
        self.removals = removals
        self.file_bytes = file_bytes
        self.key_type, self.value_type = types
        self._fields = FieldWords.of(self.value_type, len(firsts))
        weakref.finalize(self, LOCAL_DISK.release, path, file_bytes)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def nbytes(self) -> int:
        """Bytes held in memory: the fence index and where value fields lie (blocks count
        in the block cache)."""
        fences = (self._firsts, self._lasts, self._offsets, self._starts)
        words = self._fields.nbytes if self._fields is not None else 0
        return sum(int(fence.nbytes) for fence in fences) + words

    @property
    def first(self) -> int:
        """The first index key."""
        return int(self._firsts[0])

    @property
    def last(self) -> int:
        """The last index key."""
        return int(self._lasts[-1])

    @property
    def block_count(self) -> int:
        return len(self._firsts)

    def _read(self, b: int) -> tuple[Run, int]:
        """Block ``b`` read from the file (through :data:`OPEN_RUNS`), and its size."""
        try:
            batch = OPEN_RUNS.batch(self.path, b)
        except (OSError, pa.ArrowException) as e:
            raise LOCAL_DISK.damage(self, f"block {b} cannot be read ({e})") from e
        index = np.asarray(batch.column(0).to_numpy())
        return run_of(index, batch.column(1), batch.column(2)), batch.nbytes

    def block(self, b: int) -> Run:
        """Block ``b`` through the block cache."""
        found = BLOCKS.get(self.path, b)
        if found is None:
            found, size = self._read(b)
            BLOCKS.put(self.path, b, found, size, LOCAL_DISK.threshold())
        return found

    def blocks(self) -> Iterator[Run]:
        """Every block in index order, read past the block cache (scans and merges)."""
        for b in range(self.block_count):
            yield self._read(b)[0]

    def between(self, lo: int, hi: int) -> Run:
        """The rows whose index key is in ``[lo, hi]``: only the blocks whose fences overlap
        it are read (through the block cache)."""
        parts = [
            self.block(b).between(lo, hi) for b in overlapping(self._firsts, self._lasts, lo, hi)
        ]
        return concat(parts, self.key_type, self.value_type)

    # --- lookups ------------------------------------------------------------------------

    def find(
        self,
        indexer: KeyIndexer,
        index: np.ndarray,
        keys: pa.StructArray,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, pa.StructArray]:
        """For each probe, its row in this run or -1 (see :meth:`Run.positions`), and the
        values of the probes found, in probe order: through a memory map of the file, reading
        only the pages the probes touch (:func:`find_on_disk`)."""
        return find_on_disk([self], [0], indexer, (index, keys, rows))

    def positions(
        self,
        indexer: KeyIndexer,
        index: np.ndarray,
        keys: pa.StructArray,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """For each probe, its row in this run or -1 (see :meth:`Run.positions`)."""
        return self.find(indexer, index, keys, rows)[0]

    def position_of(self, indexer: KeyIndexer, h: int, key: tuple[object, ...]) -> int:
        """The row of one Python key (with index key ``h``) or -1."""
        b = int(holding(self._firsts, self._lasts, np.array([h], dtype=np.int64))[0])
        if b < 0:
            return -1
        i = self.block(b).position_of(indexer, h, key)
        return -1 if i < 0 else i + int(self._offsets[b])

    def check_length(self) -> None:
        """LocalRunDamaged unless the file is there with the length written: checked before
        its pages are read through a map, since reading a page past the end of a file
        truncated under its map kills the process (SIGBUS), where a read returns an error."""
        fault = self._length_fault()
        if fault is not None:
            raise LOCAL_DISK.damage(self, fault)

    def is_damaged(self) -> bool:
        """Whether the file was found damaged, or is now missing or not the length written
        (then remembered as damaged): one ``stat``, asked before a cached version is served."""
        if self.path in LOCAL_DISK.damaged:
            return True
        fault = self._length_fault()
        if fault is not None:
            LOCAL_DISK.mark_damaged(self.path)
        return fault is not None

    def _length_fault(self) -> str | None:
        try:
            length = os.stat(self.path).st_size
        except OSError as e:
            return f"it cannot be found ({e.strerror})"
        return None if length == self.file_bytes else f"{length} bytes, {self.file_bytes} written"

    def tables(self) -> tuple[np.ndarray, np.ndarray, FieldWords | None]:
        """Each block's first row (then the row count), where its index column is in the
        file (in words) and its value fields (None: not plain numbers)."""
        return self._offsets, self._starts, self._fields

    def _located(self, i: int) -> tuple[Run, int]:
        b = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return self.block(b), i - int(self._offsets[b])

    def value_at(self, i: int) -> Row | None:
        block, j = self._located(i)
        return block.value_at(j)

    def table(self) -> pa.Table:
        """The rows as a ``key``/``value`` table over a memory map of the file (no copy)."""
        self.check_length()
        try:
            with pa.memory_map(self.path) as source:
                table = pa.ipc.open_file(source).read_all()
        except (OSError, pa.ArrowException) as e:
            raise LOCAL_DISK.damage(self, f"it cannot be read ({e})") from e
        return table.select([1, 2]).rename_columns(["key", "value"])


Part = Run | DiskRun
"""A run in memory or in one file on local disk (a level's part)."""


def find_on_disk(
    runs: Sequence[DiskRun],
    first_rows: Sequence[int],
    indexer: KeyIndexer,
    wanted: tuple[np.ndarray, pa.StructArray, np.ndarray | None],
) -> tuple[np.ndarray, pa.StructArray]:
    """For each probe (index keys, keys, the keys' rows: ``wanted``), its row in ``runs`` (in
    index order, their ranges apart, ``runs[i]``'s rows from ``first_rows[i]``) or -1, and
    the values of the probes found, in probe order. One vectorised search over the blocks of
    every run a probe falls in, through their files' maps held open
    (:mod:`~state_runtime.store.mapped_region`, :mod:`~state_runtime.store.mapped_probes`)."""
    index, keys, rows = wanted
    rows = np.arange(len(index)) if rows is None else rows
    firsts = np.concatenate([run._firsts for run in runs])
    blocks = holding(firsts, np.concatenate([run._lasts for run in runs]), index)
    assert all(run.value_type == runs[0].value_type for run in runs)
    with contextlib.ExitStack() as held:
        files = [
            RunFile(_mapped(held, run), *run.tables(), first)
            for run, first in zip(runs, first_rows, strict=True)
        ]
        region = Region(files, runs[0].value_type, runs[0].store)
        window = LOCAL_DISK.map_window()
        found, probes, parts, clashes = find_mapped(
            region, blocks, indexer, (index, keys, rows), window
        )
    LOCAL_DISK.count_block_reads(len(np.unique(blocks[blocks >= 0])))
    for p in clashes.tolist():  # hashed keys that collide: searched in their block
        b = int(blocks[p])
        block = runs[int(region.file_of[b])].block(int(region.local[b]))
        pos = block.positions(indexer, index[p : p + 1], keys, rows[p : p + 1])
        if pos[0] >= 0:
            found[p] = pos[0] + region.first_row[b]
            probes.append(np.array([p]))
            parts.append(block.take_values(pos))
    if not parts:
        return found, pa.array([], type=runs[0].value_type)
    values = pa.concat_arrays(parts)
    by_probe = np.argsort(np.concatenate(probes), kind="stable")
    return found, values.take(pa.array(by_probe))


def _mapped(held: contextlib.ExitStack, run: DiskRun) -> Mapped:
    """``run``'s file mapped and held by ``held``; LocalRunDamaged naming the file if it is
    gone, its length is not the length written (now, or when it was mapped: a read past its
    end would read another map of the lookup's span, or fault) or its footer cannot be read."""
    run.check_length()
    try:
        mapped = held.enter_context(OPEN_RUNS.mapped(run.path))
    except (OSError, ValueError, pa.ArrowException) as e:  # ValueError: mmap of an empty file
        raise LOCAL_DISK.damage(run, f"it cannot be mapped ({e})") from e
    if len(mapped) != run.file_bytes:
        raise LOCAL_DISK.damage(run, f"mapped with {len(mapped)} bytes, {run.file_bytes} written")
    return mapped
