"""Scans of a store's state: Arrow masks over key columns, and rows in key order.

A scan passes the state block by block (one block when it is in memory, see
:mod:`state_runtime.store.disk_runs`), keeps the rows its mask selects and sorts those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.errors import InvalidArgument
from state_runtime.store.arrow_rows import Row
from state_runtime.store.sorted_runs import Run
from state_runtime.store.state_schema import StateSchema

KeyMask = Callable[[list[pa.Array]], pa.Array]
"""``mask(key_columns)``: which rows of a block a scan keeps."""


def as_prefix(bound: Any, arity: int, what: str, *, nulls: bool = False) -> Row:
    """``bound`` as a key prefix; a None field is refused unless ``nulls`` (a prefix scan's
    equality matches null; a range has no order for it)."""
    p = bound if isinstance(bound, tuple) else (bound,)
    if not 0 < len(p) <= arity:
        raise InvalidArgument(f"{what} {bound!r} must have 1..{arity} fields")
    if not nulls and any(v is None for v in p):
        raise InvalidArgument(f"keys cannot be ordered for a scan: {what} {bound!r} holds None")
    return tuple(p)


def _compare(column: pa.Array, value: Any, op: str) -> pa.Array:
    return pc.call_function(op, [column, pa.scalar(value, type=column.type)]).fill_null(False)


def _lexicographic(columns: list[pa.Array], bound: Row, op: str, *, tail: bool) -> pa.Array:
    """``key[:len(bound)] <op> bound`` as tuples compare; ``tail`` is the answer on a tie."""
    acc: pa.Array = pa.array(np.full(len(columns[0]), tail))
    for col, v in reversed(list(zip(columns, bound, strict=False))):
        acc = pc.or_(_compare(col, v, op), pc.and_(_compare(col, v, "equal"), acc))
    return acc


ArrowPredicate = Callable[[pa.StructArray, pa.StructArray], pa.Array]
"""``predicate(keys, values)``: a boolean array over a run's key and value struct arrays."""


def matching_rows(
    predicate: ArrowPredicate, keys: pa.StructArray, values: pa.StructArray
) -> pa.Table:
    """The rows with a value (not a removal) for which the predicate holds (null: false)."""
    mask = pc.and_(pc.fill_null(predicate(keys, values), False), values.is_valid())
    return pa.table({"key": keys.filter(mask), "value": values.filter(mask)})


def key_ordered(keys: pa.StructArray, values: pa.StructArray) -> Run:
    """Rows sorted by their key columns (InvalidArgument if a key type has no order)."""
    fields = keys.flatten()
    names = [f"k{i}" for i in range(len(fields))]
    try:
        order = pc.sort_indices(
            pa.table(dict(zip(names, fields, strict=True))),
            sort_keys=[(n, "ascending") for n in names],
        )
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidArgument(f"keys cannot be ordered for a scan: {e}") from e
    return Run(np.arange(len(keys)), keys.take(order), values.take(order))


def prefix_mask(prefix: Row) -> KeyMask:
    """Rows whose leading key columns equal ``prefix`` (a None field matches null)."""

    def mask(columns: list[pa.Array]) -> pa.Array:
        selected = pa.array(np.ones(len(columns[0]), dtype=bool))
        for col, v in zip(columns, prefix, strict=False):
            equal = pc.is_null(col) if v is None else _compare(col, v, "equal")
            selected = pc.and_(selected, equal)
        return selected

    return mask


def range_mask(lo: Row | None, hi: Row | None) -> KeyMask:
    """Rows with ``lo <= key < hi`` as tuples compare (None: unbounded)."""

    def mask(columns: list[pa.Array]) -> pa.Array:
        selected = pa.array(np.ones(len(columns[0]), dtype=bool))
        if lo is not None:
            selected = pc.and_(selected, _lexicographic(columns, lo, "greater", tail=True))
        if hi is not None:
            selected = pc.and_(selected, _lexicographic(columns, hi, "less", tail=False))
        return selected

    return mask


def key_ordered_rows(
    blocks: Iterable[Run], mask: KeyMask, schema: StateSchema
) -> Iterator[tuple[Row, Row]]:
    """The rows of ``blocks`` (no removals) that ``mask`` selects, sorted by key."""
    keys: list[pa.Array] = [pa.array([], schema.key_arrow)]
    values: list[pa.Array] = [pa.array([], schema.value_arrow)]
    for block in blocks:
        if len(block):
            selected = mask(block.keys.flatten())
            keys.append(block.keys.filter(selected))
            values.append(block.values.filter(selected))
    ordered = key_ordered(pa.concat_arrays(keys), pa.concat_arrays(values))
    for key, value in ordered.rows():
        assert value is not None
        yield key, value
