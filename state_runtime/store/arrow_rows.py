"""Python rows to Arrow columns and back: tuples for structs, dicts for maps, lists for arrays.

Reads hand users Python tuples and the per-key API takes them; everything else moves in Arrow.
These are the only conversions between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

Row = tuple[Any, ...]


def _columns(rows: Sequence[Row], arity: int) -> list[Sequence[Any]]:
    if not rows:
        return [[] for _ in range(arity)]
    return list(zip(*rows, strict=True))


def struct_array(rows: Sequence[Row | None], struct: pa.StructType) -> pa.StructArray:
    """Python tuples as a struct array of type ``struct``; a None row is a null struct."""
    missing = [r is None for r in rows]
    filler = (None,) * struct.num_fields
    children = [
        pa.array(col, type=struct.field(i).type)
        for i, col in enumerate(
            _columns([filler if r is None else r for r in rows], struct.num_fields)
        )
    ]
    mask = pa.array(missing, type=pa.bool_()) if any(missing) else None
    return pa.StructArray.from_arrays(children, fields=list(struct), mask=mask)


def to_python(array: pa.Array) -> list[Any]:
    """Column values shaped like what was put: structs as tuples, maps as dicts."""
    dtype = array.type
    if array.null_count == 0 and (
        pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)
    ):
        # Through numpy: about 20x faster than to_pylist for primitive columns.
        fast: list[Any] = array.to_numpy(zero_copy_only=False).tolist()
        return fast
    values = array.to_pylist(maps_as_pydicts="strict")
    fix = _tuple_converter(array.type)
    return values if fix is None else [fix(v) for v in values]


def _tuple_converter(dtype: pa.DataType) -> Callable[[Any], Any] | None:
    """A function turning nested struct dicts into tuples, or None if ``dtype`` has no struct."""
    if pa.types.is_struct(dtype):
        children = [_tuple_converter(dtype.field(i).type) for i in range(dtype.num_fields)]
        names = [dtype.field(i).name for i in range(dtype.num_fields)]
        pairs = list(zip(names, children, strict=True))
        return lambda v: (
            None if v is None else tuple(v[n] if c is None else c(v[n]) for n, c in pairs)
        )
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        item = _tuple_converter(dtype.value_type)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if pa.types.is_map(dtype):
        k, i = _tuple_converter(dtype.key_type), _tuple_converter(dtype.item_type)
        if k is None and i is None:
            return None
        kf = k or (lambda x: x)
        vf = i or (lambda x: x)
        return lambda v: None if v is None else {kf(a): vf(b) for a, b in v.items()}
    return None


def struct_rows(array: pa.StructArray) -> list[Row | None]:
    """A struct array as Python tuples (None for a null struct)."""
    columns = [to_python(c) for c in array.flatten()]
    rows: list[Row | None] = list(zip(*columns, strict=True)) if columns else [()] * len(array)
    if array.null_count:
        valid = array.is_valid().to_pylist()
        return [r if ok else None for r, ok in zip(rows, valid, strict=True)]
    return rows
