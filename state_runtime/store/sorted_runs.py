"""Sorted runs: immutable columnar rows ordered by their index key, with at most one row per key.

A :class:`Run` holds a ``key`` and a ``value`` struct array and the int64 index key of every
row (see :mod:`state_runtime.store.keys`), sorted. A null value marks a removal (in change runs; a
base run has none). Lookups are binary searches on the index, confirmed by comparing keys;
merging two runs is a vectorised merge of sorted arrays. Nothing here builds a Python object
per row, except the explicit conversions to Python rows for the per-key API.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from state_runtime.store.arrow_rows import Row, to_python
from state_runtime.store.keys import INT64_MIN, KeyIndexer, freeze

_CHUNK = 4096  # rows converted to Python at a time when iterating


class _Column:
    """Random access to one column's values as Python objects (numpy-backed when possible)."""

    __slots__ = ("_array", "_numpy")

    def __init__(self, array: pa.Array) -> None:
        self._array = array
        t = array.type
        numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
        self._numpy = (
            np.asarray(array.to_numpy(zero_copy_only=False))
            if numeric and not array.null_count
            else None
        )

    def __getitem__(self, i: int) -> Any:
        if self._numpy is not None:
            return self._numpy[i].item()
        return to_python(self._array.slice(i, 1))[0]


@dataclass(frozen=True, eq=False)
class Run:
    """Rows sorted by ``index``; ``values`` null where the row is a removal."""

    index: np.ndarray
    keys: pa.StructArray
    values: pa.StructArray

    on_disk = False
    """Whether the rows live on local disk (:class:`~state_runtime.store.disk_runs.DiskRun`)."""

    def __len__(self) -> int:
        return len(self.index)

    def slice(self, start: int, stop: int) -> Run:
        """Rows ``start`` to ``stop`` (no copy)."""
        return Run(
            self.index[start:stop],
            self.keys.slice(start, stop - start),
            self.values.slice(start, stop - start),
        )

    def blocks(self) -> Iterator[Run]:
        """The rows as in-memory runs in index order: this run itself."""
        yield self

    def pieces(self, nbytes: int) -> Iterator[Run]:
        """The rows in index order as slices of about ``nbytes`` each (no copy); equal index
        keys stay in one slice, as they do in one block of a run on disk."""
        step = max(1, nbytes * len(self) // max(1, self.nbytes))
        start = 0
        while start < len(self):
            stop = min(len(self), start + step)
            stop = int(np.searchsorted(self.index, self.index[stop - 1], side="right"))
            yield self.slice(start, stop)
            start = stop

    def between(self, lo: int, hi: int) -> Run:
        """The rows whose index key is in ``[lo, hi]``: two binary searches, no copy."""
        start = np.searchsorted(self.index, np.int64(lo), side="left")
        stop = np.searchsorted(self.index, np.int64(hi), side="right")
        return self.slice(int(start), int(stop))

    @property
    def key_type(self) -> pa.DataType:
        return self.keys.type

    @property
    def value_type(self) -> pa.DataType:
        return self.values.type

    def take_values(self, rows: np.ndarray) -> pa.StructArray:
        """The values of rows ``rows``."""
        return self.values.take(pa.array(rows, type=pa.int64()))

    @property
    def removals(self) -> int:
        return int(self.values.null_count)

    @property
    def nbytes(self) -> int:
        """Bytes held: the index plus the Arrow buffers this run's rows use."""
        index_bytes = 0 if _shares_key_buffer(self.index, self.keys) else self.index.nbytes
        return index_bytes + int(self.keys.nbytes) + int(self.values.nbytes)

    @classmethod
    def empty(cls, key_type: pa.DataType, value_type: pa.DataType) -> Run:
        return cls(
            np.empty(0, dtype=np.int64),
            pa.array([], type=key_type),
            pa.array([], type=value_type),
        )

    @classmethod
    def build(
        cls, indexer: KeyIndexer, keys: pa.StructArray, values: pa.StructArray
    ) -> tuple[Run, int]:
        """Rows in any order as a run; of rows with equal keys the last wins.

        Returns the run and how many rows were dropped as duplicates.
        """
        index = indexer.index(keys)
        if len(index) > 1 and not bool(np.all(index[1:] > index[:-1])):
            order = np.argsort(index, kind="stable")
            index = index[order]
            taken = pa.array(order)
            keys, values = keys.take(taken), values.take(taken)
            if len(index) > 1 and bool(np.any(index[1:] == index[:-1])):
                keep = _last_of_equal_keys(indexer, index, keys)
                if not bool(keep.all()):
                    mask = pa.array(keep)
                    kept = run_of(index[keep], keys.filter(mask), values.filter(mask))
                    return kept, int(len(keep) - keep.sum())
        return run_of(index, keys, values), 0

    # --- lookups ------------------------------------------------------------------------

    def positions(
        self,
        indexer: KeyIndexer,
        index: np.ndarray,
        keys: pa.StructArray,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """For each probe, its row in this run or -1.

        Probe ``i`` has index key ``index[i]`` and key ``keys[rows[i]]`` (``keys[i]`` if
        ``rows`` is None); keys are only read to confirm a match the index cannot settle.
        """
        n = len(self.index)
        found = np.full(len(index), -1, dtype=np.int64)
        if not n or not len(index):
            return found
        pos = np.searchsorted(self.index, index)
        clipped = np.minimum(pos, n - 1)
        candidates = np.flatnonzero((pos < n) & (self.index[clipped] == index))
        found[candidates] = pos[candidates]
        # One integer key column: equal index means equal key, except null against INT64_MIN.
        unsure = candidates[index[candidates] == INT64_MIN] if indexer.exact else candidates
        if len(unsure):
            probe_rows = unsure if rows is None else rows[unsure]
            probes = keys.take(pa.array(probe_rows))
            same = indexer.same(self.keys.take(pa.array(pos[unsure])), probes)
            for j in np.flatnonzero(~same):  # a collision: look further along the equal run
                found[unsure[j]] = self._scan(indexer, int(pos[unsure[j]]) + 1, probes.slice(j, 1))
        return found

    def find(
        self,
        indexer: KeyIndexer,
        index: np.ndarray,
        keys: pa.StructArray,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, pa.StructArray]:
        """:meth:`positions`, and the values of the probes found, in probe order."""
        found = self.positions(indexer, index, keys, rows)
        return found, self.take_values(found[found >= 0])

    def _scan(self, indexer: KeyIndexer, start: int, key: pa.StructArray) -> int:
        target = self.index[start - 1]
        i = start
        while i < len(self.index) and self.index[i] == target:
            if indexer.same(self.keys.slice(i, 1), key)[0]:
                return i
            i += 1
        return -1

    def position_of(self, indexer: KeyIndexer, h: int, key: tuple[Any, ...]) -> int:
        """The row of one Python key (with index key ``h``) or -1."""
        i = int(self.index.searchsorted(h))
        n = len(self.index)
        while i < n and int(self.index[i]) == h:
            if indexer.exact and h != INT64_MIN:
                return i
            if self._key_equals(i, key, indexer):
                return i
            i += 1
        return -1

    def _key_equals(self, i: int, key: tuple[Any, ...], indexer: KeyIndexer) -> bool:
        stored = self.key_at(i)
        if stored == key:
            return True
        return bool(freeze(stored) == freeze(indexer.normalize(key)))

    # --- Python access --------------------------------------------------------------------

    @cached_property
    def _key_columns(self) -> list[_Column]:
        return [_Column(c) for c in self.keys.flatten()]

    @cached_property
    def _value_columns(self) -> list[_Column]:
        return [_Column(c) for c in self.values.flatten()]

    def key_at(self, i: int) -> Row:
        return tuple([c[i] for c in self._key_columns])

    @cached_property
    def _removed(self) -> np.ndarray | None:
        if not self.values.null_count:
            return None
        return np.asarray(self.values.is_null().to_numpy(zero_copy_only=False))

    def value_at(self, i: int) -> Row | None:
        removed = self._removed
        if removed is not None and removed[i]:
            return None
        return tuple([c[i] for c in self._value_columns])

    def rows(self) -> Iterator[tuple[Row, Row | None]]:
        """Every (key, value) in index order; value None for a removal."""
        for start in range(0, len(self), _CHUNK):
            keys = self.keys.slice(start, _CHUNK)
            values = self.values.slice(start, _CHUNK)
            key_rows = zip(*(to_python(c) for c in keys.flatten()), strict=True)
            value_cols = [to_python(c) for c in values.flatten()]
            value_rows: Iterator[Row | None] = (
                zip(*value_cols, strict=True) if value_cols else iter([()] * len(values))
            )
            if values.null_count:
                valid = values.is_valid().to_pylist()
                value_rows = (v if ok else None for v, ok in zip(value_rows, valid, strict=True))
            yield from zip(key_rows, value_rows, strict=True)

    # --- merging ------------------------------------------------------------------------

    def merged_with(self, indexer: KeyIndexer, newer: Run, *, drop_removals: bool) -> Run:
        """This run overlaid by ``newer`` (its rows win); removals dropped if asked."""
        if not len(newer) and not (drop_removals and self.removals):
            return self
        hit = self.positions(indexer, newer.index, newer.keys)
        keep_old = np.ones(len(self), dtype=bool)
        keep_old[hit[hit >= 0]] = False
        if drop_removals and self.removals:
            keep_old &= np.asarray(self.values.is_valid().to_numpy(zero_copy_only=False))
        keep_new = np.ones(len(newer), dtype=bool)
        if drop_removals and newer.removals:
            keep_new = np.asarray(newer.values.is_valid().to_numpy(zero_copy_only=False))
        old_rows, new_rows = np.flatnonzero(keep_old), np.flatnonzero(keep_new)
        old_index, new_index = self.index[old_rows], newer.index[new_rows]
        # Where each kept newer row lands among the kept older rows (after equal index keys).
        out_new = np.searchsorted(old_index, new_index, side="right") + np.arange(len(new_rows))
        total = len(old_rows) + len(new_rows)
        is_new = np.zeros(total, dtype=bool)
        is_new[out_new] = True
        source = np.empty(total, dtype=np.int64)
        source[~is_new] = old_rows
        source[is_new] = len(self) + new_rows
        index = np.empty(total, dtype=np.int64)
        index[~is_new] = old_index
        index[is_new] = new_index
        taken = pa.array(source)
        keys = pa.concat_arrays([self.keys, newer.keys]).take(taken)
        values = pa.concat_arrays([self.values, newer.values]).take(taken)
        return run_of(index, keys, values)


def concat(runs: list[Run], key_type: pa.DataType, value_type: pa.DataType) -> Run:
    """Runs that follow each other in index order as one run."""
    if len(runs) == 1:
        return runs[0]
    if not runs:
        return Run.empty(key_type, value_type)
    return run_of(
        np.concatenate([r.index for r in runs]),
        pa.concat_arrays([r.keys for r in runs]),
        pa.concat_arrays([r.values for r in runs]),
    )


def _shares_key_buffer(index: np.ndarray, keys: pa.StructArray) -> bool:
    """Whether ``index`` is the key column's own buffer (one int64 key column, no copy)."""
    if keys.type.num_fields != 1 or not len(index):
        return False
    data = keys.flatten()[0].buffers()[1]
    return data is not None and bool(
        np.may_share_memory(index, np.frombuffer(data, dtype=np.uint8))
    )


def run_of(index: np.ndarray, keys: pa.StructArray, values: pa.StructArray) -> Run:
    """A run; one int64 key column without nulls is rebuilt on the index (held once)."""
    if (
        keys.type.num_fields == 1
        and keys.type.field(0).type == pa.int64()
        and not keys.flatten()[0].null_count
        and not _shares_key_buffer(index, keys)
    ):
        keys = pa.StructArray.from_arrays([pa.array(index)], fields=list(keys.type))
    return Run(index, keys, values)


def _last_of_equal_keys(indexer: KeyIndexer, index: np.ndarray, keys: pa.StructArray) -> np.ndarray:
    """A mask keeping, among rows with equal keys (sorted by index, stable), the last one."""
    keep = np.ones(len(index), dtype=bool)
    pairs = np.flatnonzero(index[1:] == index[:-1])
    same = indexer.same(keys.take(pa.array(pairs)), keys.take(pa.array(pairs + 1)))
    keep[pairs[same]] = False
    collided = pairs[~same]
    if len(collided):  # different keys share an index key: compare within each such group
        for start in np.unique(collided):
            lo = int(np.searchsorted(index, index[start], side="left"))
            hi = int(np.searchsorted(index, index[start], side="right"))
            seen: set[Any] = set()
            for i in range(hi - 1, lo - 1, -1):
                frozen = freeze(tuple(to_python(c)[0] for c in keys.slice(i, 1).flatten()))
                keep[i] = frozen not in seen
                seen.add(frozen)
    return keep
