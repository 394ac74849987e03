"""Spark's row routing, in Python: ``pmod(hash(columns), n)``, vectorised over Arrow arrays.

Spark's ``hash`` is Murmur3 x86 32-bit with seed 42, folded over the columns (each column's
hash seeds the next; a null leaves the running hash as it is). Integers of up to 32 bits,
booleans and dates hash as one int, 64-bit integers and timestamps as one long (low word
first), floats and doubles as their IEEE bits (``-0.0`` as ``0.0``), and strings and binaries
by Spark's own byte variant: little-endian 4-byte words, then each remaining byte, sign
extended, as one more word. A repartition without Spark routes keys with it exactly as the
runtime's ``repartition(n, key columns)`` does (tests/maintenance/test_spark_hash.py compares it
with Spark's ``spark_partition_id()``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.errors import InvalidArgument

SEED = 42
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_U32 = np.uint32
_BYTES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _U32(5) + _U32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray) -> np.ndarray:
    h1 = h1 ^ length.astype(_U32)
    h1 = h1 ^ (h1 >> _U32(16))
    h1 = h1 * _U32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> _U32(13))
    h1 = h1 * _U32(0xC2B2AE35)
    out: np.ndarray = h1 ^ (h1 >> _U32(16))
    return out


def _hash_ints(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(values.astype(np.int32).view(_U32))), np.full_like(seed, 4))


def _hash_longs(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    words = values.astype(np.int64).view(np.uint64)
    low = (words & np.uint64(0xFFFFFFFF)).astype(_U32)
    high = (words >> np.uint64(32)).astype(_U32)
    h1 = _mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high))
    return _fmix(h1, np.full_like(seed, 8))


def _hash_bytes(array: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Spark's ``hashUnsafeBytes`` of each value's bytes (UTF-8 for strings)."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets_type = np.dtype(np.int64 if large else np.int32)
    array = array.fill_null("" if pa.types.is_string(array.type) else b"")
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offsets_type)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0)
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    padded = np.concatenate([data.astype(np.uint8), np.zeros(4, dtype=np.uint8)])
    h1 = seed.copy()
    words = lengths // 4
    for j in range(int(words.max(initial=0))):
        rows = np.nonzero(words > j)[0]
        at = starts[rows] + 4 * j
        word = (
            padded[at].astype(_U32)
            | (padded[at + 1].astype(_U32) << _U32(8))
            | (padded[at + 2].astype(_U32) << _U32(16))
            | (padded[at + 3].astype(_U32) << _U32(24))
        )
        h1[rows] = _mix_h1(h1[rows], _mix_k1(word))
    for t in range(3):
        rows = np.nonzero(lengths - 4 * words > t)[0]
        byte = padded[starts[rows] + 4 * words[rows] + t].view(np.int8).astype(np.int32)
        h1[rows] = _mix_h1(h1[rows], _mix_k1(byte.view(_U32)))
    return _fmix(h1, lengths)


def _hash_column(array: pa.Array, seed: np.ndarray) -> np.ndarray:
    """The running hash after ``array`` (a null leaves it as it is)."""
    t = array.type
    if pa.types.is_dictionary(t):
        return _hash_column(array.dictionary_decode(), seed)
    if any(is_(t) for is_ in _BYTES):
        hashed = _hash_bytes(array, seed)
    elif pa.types.is_boolean(t):
        hashed = _hash_ints(_numbers(array.cast(pa.int32())), seed)
    elif pa.types.is_integer(t) and t.bit_width <= 32 and t != pa.uint32():
        hashed = _hash_ints(_numbers(array), seed)
    elif t == pa.int64():
        hashed = _hash_longs(_numbers(array), seed)
    elif pa.types.is_date32(t):
        hashed = _hash_ints(_numbers(array.view(pa.int32())), seed)
    elif pa.types.is_timestamp(t) and t.unit == "us":
        hashed = _hash_longs(_numbers(array.view(pa.int64())), seed)
    elif pa.types.is_float32(t):
        singles = _numbers(array) + np.float32(0.0)  # -0.0 + 0.0 is 0.0, as Spark has it
        singles[np.isnan(singles)] = np.float32("nan")  # Java's floatToIntBits: one NaN
        hashed = _hash_ints(singles.view(np.int32), seed)
    elif pa.types.is_float64(t):
        bits = _numbers(array) + 0.0
        bits[np.isnan(bits)] = np.nan
        hashed = _hash_longs(bits.view(np.int64), seed)
    else:
        raise InvalidArgument(
            f"routing a key of type {t} needs Spark's own hash: repartition it with a Spark session"
        )
    valid = np.asarray(pc.is_valid(array).to_numpy(zero_copy_only=False), dtype=bool)
    return np.where(valid, hashed, seed)


def _numbers(array: pa.Array) -> np.ndarray:
    """The array's values (a null's slot as zero: its hash is discarded)."""
    zero = pa.scalar(0, type=array.type) if not pa.types.is_floating(array.type) else 0.0
    return np.asarray(array.fill_null(zero).to_numpy(zero_copy_only=False)).copy()


def spark_hash(columns: Sequence[pa.Array], rows: int | None = None) -> np.ndarray:
    """Spark's ``hash(columns...)`` of each row, as signed 32-bit integers."""
    count = rows if rows is not None else len(columns[0])
    h = np.full(count, SEED, dtype=np.int64).astype(_U32)
    for column in columns:
        combined = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        h = _hash_column(combined, h)
    return h.view(np.int32)


def spark_partition(columns: Sequence[pa.Array], partitions: int) -> np.ndarray:
    """``pmod(hash(columns...), partitions)``: the partition Spark routes each row to."""
    if partitions < 1:
        raise InvalidArgument(f"a partition count must be at least 1, not {partitions}")
    return np.mod(spark_hash(columns).astype(np.int64), partitions).astype(np.int32)
