"""Key rows to a sortable int64 *index key*: the value itself for one integer column, else a hash.

The columnar state finds a row by the index key of its key columns, kept sorted. For a store
keyed by one integer column the index key is the integer itself (index order is key order and
no hashing is needed); otherwise it is a 64-bit hash of the key columns. Equal keys always get
equal index keys; different keys may share one (a hash collision, or a null next to the
smallest int64), so a match on the index key is confirmed by comparing the keys themselves.

With a *clustering prefix* of ``p`` key fields (``StoreConfig.scan_prefix``), the high
:data:`GROUP_BITS` bits of the hash are those of the first ``p`` fields alone and the low bits
those of the whole key: the rows sharing those fields (a grouping key's list elements, map
entries or timers) sit in one range of index keys, which a prefix scan finds by binary
search instead of a pass over the state (:meth:`KeyIndexer.prefix_span`).

Hashes are process-local (Python salts ``hash`` of strings per process) and never written to a
file. Floating-point key columns compare by value with -0.0 equal to 0.0 and every NaN equal to
every other NaN, as Spark normalises grouping keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.store.arrow_rows import to_python

M64 = (1 << 64) - 1
INT64_MIN = -(1 << 63)
_NULL = 0x6A09E667F3BCC909  # the canonical word of a null column value
_SEED = 0x243F6A8885A308D3
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
GROUP_BITS = 36
"""High bits of a clustered index key taken from the clustering prefix's hash."""
_LOW = (1 << (64 - GROUP_BITS)) - 1
_HIGH = M64 ^ _LOW


def _signed(h: int) -> int:
    return h - (1 << 64) if h >> 63 else h


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 words (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_C1)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_C2)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def _mix_int(x: int) -> int:
    """:func:`_mix` on one Python int in [0, 2**64)."""
    x ^= x >> 30
    x = (x * _C1) & M64
    x ^= x >> 27
    x = (x * _C2) & M64
    return x ^ (x >> 31)


class _Nan:
    """The one NaN that equals itself, for comparing and hashing float key values."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Nan)

    def __hash__(self) -> int:
        return 0x7FF8


_NAN = _Nan()


def freeze(value: Any) -> Any:
    """A hashable, comparable form of a Python value read from Arrow (nested types included)."""
    if isinstance(value, float):
        return _NAN if math.isnan(value) else value + 0.0
    if isinstance(value, dict):  # a map, as to_python gives it
        return frozenset((freeze(k), freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


_PLAIN = frozenset({int, str, bytes, bool, type(None)})


def freeze_key(key: tuple[Any, ...]) -> Any:
    """:func:`freeze` of a key tuple, the tuple itself when every value is a plain scalar
    (the common case, with no nested value or float to normalise: no copy, no recursion)."""
    for value in key:
        if type(value) not in _PLAIN:
            return freeze(key)
    return key


_NUMERIC_VIEWS = {
    pa.date32(): np.int32,
    pa.date64(): np.int64,
}


def _numeric_words(col: pa.Array) -> np.ndarray | None:
    """Integer, boolean, temporal and float columns as uint64 words (nulls undefined); else None."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return np.asarray(col.cast(pa.int64()).fill_null(0).to_numpy()).view(np.uint64)
    if pa.types.is_floating(t):
        f = np.asarray(col.cast(pa.float64()).fill_null(0.0).to_numpy()) + 0.0  # -0.0 -> 0.0
        f[np.isnan(f)] = np.nan
        return f.view(np.uint64)
    if t in _NUMERIC_VIEWS or pa.types.is_timestamp(t) or pa.types.is_time(t):
        width = np.int32 if t.bit_width == 32 else np.int64
        raw = np.frombuffer(col.buffers()[1], dtype=width)[col.offset : col.offset + len(col)]
        return raw.astype(np.int64).view(np.uint64)
    if pa.types.is_duration(t):
        return np.asarray(col.cast(pa.int64()).fill_null(0).to_numpy()).view(np.uint64)
    return None


def _is_bytes_like(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


class KeyIndexer:
    """Index keys and key equality for one key schema (an Arrow struct type)."""

    def __init__(self, key_type: pa.StructType, prefix: int = 0) -> None:
        self.type = key_type
        self.types = [key_type.field(i).type for i in range(key_type.num_fields)]
        self.prefix = prefix if 0 < prefix < len(self.types) else 0
        """The clustering prefix's field count (0: none; see the module)."""
        self.exact = len(self.types) == 1 and pa.types.is_integer(self.types[0])
        self._fast: list[type[Any]] = [
            int
            if pa.types.is_integer(t)
            else str
            if pa.types.is_string(t) or pa.types.is_large_string(t)
            else bytes
            if pa.types.is_binary(t) or pa.types.is_large_binary(t)
            else type(None)
            for t in self.types
        ]

    # --- vectorised -------------------------------------------------------------------

    def index(self, keys: pa.StructArray) -> np.ndarray:
        """The int64 index key of every row of ``keys``."""
        columns = keys.flatten()
        if self.exact:
            col = columns[0]
            if col.null_count:
                col = col.cast(pa.int64()).fill_null(INT64_MIN)
            return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
        h = np.full(len(keys), _SEED, dtype=np.uint64)
        group = h
        for i, col in enumerate(columns):
            if i == self.prefix:
                group = h
            h = _mix(h ^ self._words(col))
        if self.prefix:
            h = (group & np.uint64(_HIGH)) | (h & np.uint64(_LOW))
        return h.view(np.int64)

    def _words(self, col: pa.Array) -> np.ndarray:
        """One uint64 word per value (equal values give equal words; nulls a fixed word)."""
        words = _numeric_words(col)
        if words is None:
            hashed: Iterable[int]
            if _is_bytes_like(col.type):
                hashed = map(hash, col.to_pylist())
            else:
                hashed = (hash(freeze(v)) for v in to_python(col))
            words = np.fromiter(hashed, dtype=np.int64, count=len(col)).view(np.uint64)
        if col.null_count:
            words = np.where(
                np.asarray(col.is_valid().to_numpy(zero_copy_only=False)), words, np.uint64(_NULL)
            )
        return words

    def same(self, a: pa.StructArray, b: pa.StructArray) -> np.ndarray:
        """Row-wise key equality of two equally long key arrays (nulls equal nulls)."""
        result = np.ones(len(a), dtype=bool)
        for x, y in zip(a.flatten(), b.flatten(), strict=True):
            xn = np.asarray(x.is_null().to_numpy(zero_copy_only=False))
            yn = np.asarray(y.is_null().to_numpy(zero_copy_only=False))
            wx, wy = _numeric_words(x), _numeric_words(y)
            if wx is not None and wy is not None:
                eq = wx == wy
            elif _is_bytes_like(x.type):
                eq = np.asarray(pc.equal(x, y).fill_null(False).to_numpy(zero_copy_only=False))
            else:
                eq = np.array(
                    [
                        freeze(p) == freeze(q)
                        for p, q in zip(to_python(x), to_python(y), strict=True)
                    ],
                    dtype=bool,
                )
            result &= (xn & yn) | (~xn & ~yn & eq)
        return result

    # --- one key, from Python ---------------------------------------------------------

    def index_of(self, key: Sequence[Any]) -> int:
        """The index key of one Python key tuple; equal to :meth:`index` of the same row."""
        if self.exact:
            v = key[0]
            if v is None:
                return INT64_MIN
            if type(v) is int and INT64_MIN <= v <= -INT64_MIN - 1:
                return v
            return int(self.index(self.to_arrow([key]))[0])
        h = self._hash(key)
        if self.prefix:
            h = (self._hash(key[: self.prefix]) & _HIGH) | (h & _LOW)
        return _signed(h)

    def _hash(self, values: Sequence[Any]) -> int:
        """The unsigned hash of the leading key fields ``values``, as :meth:`index` mixes."""
        h = _SEED
        for v, fast, t in zip(values, self._fast, self.types, strict=False):
            if v is None:
                word = _NULL
            elif type(v) is fast:
                word = (int(v) if fast is int else hash(v)) & M64
            else:
                word = int(self._words(pa.array([v], type=t))[0])
            h = _mix_int(h ^ word)
        return h

    def prefix_span(self, prefix: Sequence[Any]) -> tuple[int, int] | None:
        """The index keys ``[lo, hi]`` that every key starting with ``prefix`` falls in (with
        keys of other prefixes that share the high bits: a scan still compares), or None
        without a clustering prefix or for a prefix shorter than it."""
        if not self.prefix or len(prefix) < self.prefix:
            return None
        high = self._hash(prefix[: self.prefix]) & _HIGH
        return _signed(high), _signed(high | _LOW)

    def normalize(self, key: Sequence[Any]) -> tuple[Any, ...]:
        """``key`` as reads return it and :func:`freeze` compares it (a trip through Arrow for
        values other than ints, strings and bytes of their own column type)."""
        if all(v is None or type(v) is fast for v, fast in zip(key, self._fast, strict=True)):
            return tuple(key)
        return tuple(to_python(c)[0] for c in self.to_arrow([key]).flatten())

    def to_arrow(self, keys: Sequence[Sequence[Any]]) -> pa.StructArray:
        """Python key tuples as a key struct array (raises Arrow's errors for bad values)."""
        columns: list[Sequence[Any]] = (
            list(zip(*keys, strict=True)) if keys else [[] for _ in self.types]
        )
        return pa.StructArray.from_arrays(
            [pa.array(c, type=t) for c, t in zip(columns, self.types, strict=True)],
            fields=list(self.type),
        )
