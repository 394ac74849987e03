"""Batch lookups in run files on local disk (a run's, or a level's parts') through memory
maps: only the pages a probe's binary search and its value touch are read (and the 64 KiB
the kernel maps around each fault), never whole blocks.

A batch of random keys touches nearly every block of a run (2,500 keys over 470 blocks), and
reading a block whole (a 64 KiB ``pread``, an Arrow batch decoded, a run built and searched,
values taken: about 0.4 ms each) made a lookup cost the run's size, not the keys'. Here the
files are mapped read-only (the maps kept open between lookups, read as one span of words:
:mod:`~state_runtime.store.mapped_region`); the probes, grouped by the block their fences name, are
binary-searched together (one vectorised search over every block's index column, which
lies in the file as plain int64 words: :func:`index_words`), and the values (and, where the
index key cannot settle it, the keys) of the rows found are taken by Arrow from zero-copy
views of the blocks that hold them, block by block. The blocks are visited in index order,
in groups spanning at most the larger of the spill threshold and 8 MiB of the files
(``LocalDisk.map_window``: a fixed overhead, since each group costs a few calls whatever its
size). A dense group (at
least as many probes as blocks it spans) has its pages in each file from 1 MiB mapped in one
call (``MADV_POPULATE_READ``); a sparse one lets the pages its probes touch
fault in, so a few probes far apart never map the pages between them. The pages a group
touched are dropped from the process (``MADV_DONTNEED``) before the next: the resident set
grows by at most a group, whatever the run's size. The pages stay in the operating system's
page cache, which serves a later lookup. Where ``madvise`` is missing (not Unix) the pages
fault in and stay resident until the map is closed.
"""

from __future__ import annotations

import io
import mmap
import struct

import numpy as np
import pyarrow as pa

from state_runtime.store.keys import INT64_MIN, KeyIndexer
from state_runtime.store.mapped_region import Region
from state_runtime.store.open_runs import Mapped

MADV_POPULATE_READ = 22
"""Linux 5.14+: map a range's pages in one call (older kernels refuse it: pages fault in)."""

MADV_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)
"""Drop a range's pages from the process (None where ``madvise`` is missing)."""

POPULATE_BYTES = 1 << 20
"""A dense group's pages in a file are mapped in one call from this size: a level's small
parts fault in their few 64 KiB windows for less than the call (64 parts, 2,500 keys:
32 ms against 41 ms a lookup with the call, one file's 26 ms either way)."""

FAULT_AROUND = 64 << 10
"""Bytes around a page fault that Linux maps too (``fault_around_bytes``, 64 KiB)."""


def index_words(path: str, messages: list[int], firsts: np.ndarray) -> np.ndarray:
    """Where each block's index column starts in the file, in 8-byte words, given where
    each block's message starts (the first one after the magic and the schema).

    An Arrow IPC message is a continuation marker, the metadata's length, the metadata and
    the body; a block's body starts with its index column (no validity bytes: it has no
    nulls; the columns' types hold no dictionary, so no dictionary batch comes before the
    first block). Read with two small unbuffered reads a block, never mapped: mapping would
    bring in the pages around each (fault-around), the whole file. Each block's first word
    is checked against its first index key, and the alignment to 8 bytes: ValueError if the
    file is not as written."""
    starts = np.empty(len(messages), dtype=np.int64)
    with open(path, "rb", buffering=0) as file:
        for b, at in enumerate(messages):
            if not b:  # the magic (8 bytes), then the schema's message (no body)
                at = 16 + _header(file, 8)
            start = at + 8 + _header(file, at)
            word = np.frombuffer(_read(file, start), dtype=np.int64)
            if start % 8 or len(word) != 1 or word[0] != firsts[b]:
                raise ValueError(f"block {b}'s index column is not where expected")
            starts[b] = start // 8
    return starts


def _read(file: io.RawIOBase, at: int) -> bytes:
    """The 8 bytes at byte ``at`` (fewer at the end of the file)."""
    file.seek(at)
    return file.read(8) or b""


def _header(file: io.RawIOBase, at: int) -> int:
    """The metadata length of the IPC message at byte ``at``."""
    head = _read(file, at)
    marker, length = struct.unpack("<Ii", head) if len(head) == 8 else (0, 0)
    if marker != 0xFFFFFFFF:
        raise ValueError(f"no Arrow IPC message at byte {at}")
    return int(length)


def _touched(mapped: Mapped, span: tuple[int, int]) -> tuple[int, int]:
    """The pages a group with ``span`` in ``mapped`` may have mapped: its first block's
    metadata before the span (under 64 KiB) and the window the kernel maps around each fault
    (64 KiB aligned), so from two windows before the span to one after. Not from an earlier
    group's span: the ranges of consecutive groups overlap by three windows at most."""
    start = max(0, span[0] - 2 * FAULT_AROUND) // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(len(mapped), span[0] + span[1] + FAULT_AROUND)
    return start, end - start


def _search(words: np.ndarray, start: np.ndarray, n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each probe, the first row ``i`` of its block with ``words[start + i] >= x`` (the
    block's rows are ``n`` sorted int64 words from ``start``): a vectorised binary search."""
    lo = np.zeros(len(x), dtype=np.int64)
    hi = n.astype(np.int64, copy=True)
    last = np.maximum(n - 1, 0)
    for _ in range(int(n.max()).bit_length()):
        mid = (lo + hi) >> 1
        less = words[start + np.minimum(mid, last)] < x
        going = lo < hi
        lo = np.where(going & less, mid + 1, lo)
        hi = np.where(going & ~less, mid, hi)
    return lo


def find_mapped(
    region: Region,
    blocks: np.ndarray,
    indexer: KeyIndexer,
    wanted: tuple[np.ndarray, pa.StructArray, np.ndarray],
    group_bytes: int,
) -> tuple[np.ndarray, list[np.ndarray], list[pa.Array], np.ndarray]:
    """The probes ``wanted``: index keys ``index`` and keys ``keys[rows[i]]``, in the run
    files of ``region``, each probe in its block ``blocks[i]`` (-1: none); the values of
    blocks whose field words are learnt are read as words, the others' through Arrow (which
    learns them).

    Returns each probe's row (the region's row numbers) or -1, then the probes found and
    their values in pieces, and the probes whose index key matched a row with another key
    (a collision of hashed keys: the caller searches those in their blocks; their row here
    is -1)."""
    index = wanted[0]
    found = np.full(len(index), -1, dtype=np.int64)
    probes: list[np.ndarray] = []
    values: list[pa.Array] = []
    collided: list[np.ndarray] = []
    inside = np.flatnonzero(blocks >= 0)
    if not len(inside):
        return found, probes, values, np.empty(0, dtype=np.int64)
    order = inside[np.argsort(blocks[inside], kind="stable")]
    ordered = blocks[order]
    # Groups of consecutive blocks: those starting in the same group_bytes of the files.
    group_of = region.place[ordered] // max(group_bytes, 1)
    bounds = np.r_[np.flatnonzero(group_of[1:] != group_of[:-1]) + 1, len(order)]
    starts, first_row = region.starts, region.first_row
    words = region.words()
    try:
        lo = 0
        for hi in bounds.tolist():  # every group holds a probe
            group, b, lo = order[lo:hi], ordered[lo:hi], hi
            spans = region.spans(int(b[0]), int(b[-1]))
            if len(group) > b[-1] - b[0]:  # dense: one call maps the pages, not a fault each
                for mapped, span in spans:
                    if span[1] >= POPULATE_BYTES:
                        mapped.advise(MADV_POPULATE_READ, span)
            n = region.rows[b]
            pos = _search(words, starts[b], n, index[group])
            hit = (pos < n) & (words[starts[b] + np.minimum(pos, n - 1)] == index[group])
            group, b, pos = group[hit], b[hit], pos[hit]
            if indexer.exact:  # a key whose index key settles it
                quick = region.known(b) & (index[group] != INT64_MIN)
                if quick.any():
                    found[group[quick]] = first_row[b[quick]] + pos[quick]
                    probes.append(group[quick])
                    values.append(region.gather(b[quick], pos[quick]))
                    group, b, pos = group[~quick], b[~quick], pos[~quick]
            if len(group):
                kept, taken, clash = _values(region, indexer, (b, pos, group), wanted)
                found[group[kept]] = first_row[b[kept]] + pos[kept]
                probes.append(group[kept])
                values.append(taken)
                collided.append(group[clash])
            for mapped, span in spans:
                mapped.advise(MADV_DONTNEED, _touched(mapped, span))
    finally:  # no view of the maps outlives the lookup in a traceback
        del words
    clashes = np.concatenate(collided) if collided else np.empty(0, dtype=np.int64)
    return found, probes, values, clashes


def _values(
    region: Region,
    indexer: KeyIndexer,
    here: tuple[np.ndarray, np.ndarray, np.ndarray],
    wanted: tuple[np.ndarray, pa.StructArray, np.ndarray],
) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """For probes ``group`` whose index key is at row ``pos`` of block ``b`` (``here``, ``b``
    sorted): which of them hold their key there (a mask), the values of those, and the
    positions in ``group`` of those that do not (another key with the same index key).
    The blocks are read through Arrow from the maps (their runs learn their field words)."""
    b, pos, group = here
    index, keys, rows = wanted
    touched, chunk = np.unique(b, return_inverse=True)
    batches = region.batches(touched.tolist())
    kept = np.ones(len(group), dtype=bool)
    unsure = np.flatnonzero(index[group] == INT64_MIN) if indexer.exact else np.arange(len(b))
    if len(unsure):
        stored = _gathered([batch.column(1) for batch in batches], chunk[unsure], pos[unsure])
        probe_keys = keys.take(pa.array(rows[group[unsure]], type=pa.int64()))
        kept[unsure] = indexer.same(stored, probe_keys)
    taken = _gathered([batch.column(2) for batch in batches], chunk[kept], pos[kept])
    return kept, taken, np.flatnonzero(~kept)


def _gathered(columns: list[pa.Array], chunk: np.ndarray, pos: np.ndarray) -> pa.Array:
    """Row ``pos[i]`` of ``columns[chunk[i]]`` for each ``i`` (``chunk`` sorted), taken
    block by block: Arrow's take over a chunked array of structs copies its chunks into one
    array first, and over the blocks of a mapped file that copy cost more than the take
    (measured: 2.6 ms for 8 blocks against 30 us a block taken alone)."""
    cuts = np.searchsorted(chunk, np.arange(len(columns) + 1)).tolist()
    at = pa.array(pos, type=pa.int64())
    parts = [
        column.take(at.slice(lo, hi - lo))
        for column, lo, hi in zip(columns, cuts[:-1], cuts[1:], strict=True)
        if hi > lo
    ]
    return pa.concat_arrays(parts) if parts else columns[0].slice(0, 0)
