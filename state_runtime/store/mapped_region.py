"""The run files a batch lookup reads, mapped and read as one sequence of blocks: a run on
disk's one file, or the files of a level's parts that the probes fall in.

A level of parts side by side answered a batch lookup part after part, each with its own
binary search, value gathers and bookkeeping: about 1 ms a part that receives probes, so 64
parts cost 5 times one file of the same rows. Here the blocks of every file touched are
numbered in index order in one table (where each block's index column and value fields lie,
its first row and row count), and the maps are read through one array of words spanning
them, so the search and the gathers are each one vectorised pass whatever the part count.
The spanning array is a view from the lowest map's address to the end of the highest: only
the offsets inside a map (found from the table) are ever read, and only while the maps are
held open for the lookup (:meth:`~state_runtime.store.open_runs.OpenRuns.mapped`). A read
past a map's end would land in another map, not fail: so a file shorter than written is
refused (``find_on_disk``), and so is a table whose blocks do not lie inside their own files;
and the view keeps a buffer export of each map, so a map is never unmapped under it.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from state_runtime.errors import StateStoreError
from state_runtime.store.field_words import FieldWords
from state_runtime.store.open_runs import WORD, Mapped


@dataclass(frozen=True)
class RunFile:
    """A run file held mapped for a lookup, and what its run knows of its blocks."""

    mapped: Mapped
    offsets: np.ndarray  # first row of each block, then the row count
    starts: np.ndarray  # each block's index column in the file, in words
    fields: FieldWords | None
    first_row: int  # the row of the file's first row in what the lookup answers


class Region:
    """Run files mapped for one batch lookup, their blocks numbered in index order (see the
    module). StateStoreError naming the file if a block's index column does not lie wholly
    inside its own file (a damaged file: read through the span, it would read another map)."""

    def __init__(self, files: Sequence[RunFile], value_type: pa.DataType, store: object) -> None:
        first = files[0].fields
        assert all(  # the first file's value fields are read for all
            (f.fields is None) == (first is None)
            and (first is None or f.fields is None or f.fields.dtypes == first.dtypes)
            for f in files
        )
        self.files = files
        self._type = value_type
        addresses = np.array([f.mapped.address[0] for f in files], dtype=np.int64)
        self._base = int(addresses.min())
        self._size = max(f.mapped.address[0] + len(f.mapped) for f in files) - self._base
        self.shift = addresses - self._base  # where each file lies in the span, in bytes
        counts = np.array([len(f.starts) for f in files])
        sizes = np.array([len(f.mapped) for f in files], dtype=np.int64)
        firsts = np.cumsum(counts) - counts  # each file's first block in the region
        self.file_of = np.repeat(np.arange(len(files)), counts)
        self.local = np.arange(int(counts.sum())) - firsts[self.file_of]
        # Each file's block offsets, then its row count: the row counts are left out.
        offsets = np.concatenate([f.offsets for f in files])
        begins = np.delete(np.arange(len(offsets)), np.cumsum(counts + 1) - 1)
        self.rows = offsets[begins + 1] - offsets[begins]
        first_rows = np.array([f.first_row for f in files], dtype=np.int64)
        self.first_row = offsets[begins] + first_rows[self.file_of]
        local_starts = np.concatenate([f.starts for f in files])
        outside = (local_starts < 0) | ((local_starts + self.rows) * 8 > sizes[self.file_of])
        if outside.any():
            raise StateStoreError(
                "a run file on local disk is damaged: a block's index column lies past its end",
                store=store,
                path=files[int(self.file_of[np.argmax(outside)])].mapped.path,
            )
        self.starts = local_starts + (self.shift // 8)[self.file_of]
        ends = np.r_[local_starts[1:] * 8, 0]  # the next block's start, else its file's end
        ends[np.cumsum(counts) - 1] = sizes
        self.ends = ends + self.shift[self.file_of]
        self.place = local_starts * 8 + (np.cumsum(sizes) - sizes)[self.file_of]
        self._at = self._field_words()

    def _field_words(self) -> np.ndarray | None:
        """Each block's value fields in the span, in each field's words (-1: not learnt),
        or None where the values are not plain numbers."""
        fields = [f.fields for f in self.files]
        if fields[0] is None:
            return None
        at = np.concatenate([f.at for f in fields if f is not None])
        itemsizes = np.array([dtype.itemsize for dtype in fields[0].dtypes])
        shifts = self.shift[self.file_of][:, None] // itemsizes
        joined: np.ndarray = np.where(at >= 0, at + shifts, -1)
        return joined

    def words(self, dtype: np.dtype = WORD) -> np.ndarray:
        """The span as ``dtype`` words: one map's own view, else a view of the addresses from
        the lowest map to the end of the highest (read only where :attr:`starts` and the
        field words say)."""
        if len(self.files) == 1:
            return self.files[0].mapped.words(dtype)
        views = [f.mapped.words() for f in self.files]
        return np.asarray(_Addresses(self._base, self._size // dtype.itemsize, dtype, views))

    def known(self, blocks: np.ndarray) -> np.ndarray:
        """Whether each of ``blocks`` has its value fields learnt."""
        if self._at is None:
            return np.zeros(len(blocks), dtype=bool)
        known: np.ndarray = self._at[blocks, 0] >= 0
        return known

    def gather(self, blocks: np.ndarray, rows: np.ndarray) -> pa.StructArray:
        """The values at row ``rows[i]`` of block ``blocks[i]`` (each learnt), one gather a
        field."""
        assert self._at is not None and self.files[0].fields is not None
        arrays = []
        for c, (field, dtype) in enumerate(
            zip(self._type, self.files[0].fields.dtypes, strict=True)
        ):
            words = self.words(dtype)
            arrays.append(pa.array(words[self._at[blocks, c] + rows], type=field.type))
            del words
        return pa.StructArray.from_arrays(arrays, fields=list(self._type))

    def batches(self, blocks: list[int]) -> list[pa.RecordBatch]:
        """The record batches of ``blocks``, zero-copy views of the maps; their runs' field
        words learn them."""
        batches = []
        for b in blocks:
            f = self.files[int(self.file_of[b])]
            local = int(self.local[b])
            batch = f.mapped.reader.get_batch(local)
            if f.fields is not None:
                f.fields.learn(f.mapped.address, [local], [batch])
            batches.append(batch)
        return batches

    def spans(self, first: int, last: int) -> list[tuple[Mapped, tuple[int, int]]]:
        """The pages of each file from block ``first``'s index column to the end of block
        ``last``, as (map, (start, length)) in the file."""
        spans = []
        for f in range(int(self.file_of[first]), int(self.file_of[last]) + 1):
            held = np.flatnonzero(self.file_of[first : last + 1] == f) + first
            shift = int(self.shift[f])
            begin = int(self.starts[held[0]]) * 8 - shift
            begin = begin // mmap.PAGESIZE * mmap.PAGESIZE
            end = int(self.ends[held[-1]]) - shift
            spans.append((self.files[f].mapped, (begin, end - begin)))
        return spans


class _Addresses:
    """Read-only words at an address, as numpy takes them (``__array_interface__``). It holds
    ``views`` of the maps it spans (each a buffer export), so that while an array of it lives
    (a traceback's frame may keep one) a map's ``close`` is refused rather than unmapping the
    memory under it (:meth:`~state_runtime.store.open_runs.Mapped.close`)."""

    def __init__(self, address: int, count: int, dtype: np.dtype, views: list[np.ndarray]) -> None:
        self.views = views
        self.__array_interface__ = {
            "version": 3,
            "data": (address, True),
            "shape": (count,),
            "typestr": dtype.str,
        }
