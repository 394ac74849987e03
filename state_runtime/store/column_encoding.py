"""Integer columns of a checkpoint file stored narrow (format version 2).

A delta of a few thousand random keys out of a million holds about ten bits of information per
key, but an int64 column spends 64 on it and zstd over 8-byte integers wins back only part of
that. So, before the Arrow stream is written, an integer field of the ``key`` or ``value`` struct
may be stored as:

- ``delta``: the first key field, when the rows are in key order and it has no nulls: each row's
  difference from the previous row (0 for the first), plus ``base``, the first row's value;
- ``offset``: any other integer field: each value minus ``base`` (the smallest value), nulls kept;

each in the narrowest signed integer type that holds the stored numbers, and only when that is
narrower than the field's own type. Which fields are stored how is the JSON object under the
schema metadata key :data:`ENCODINGS_KEY`, by struct and field position
(``{"key.0": {"kind": "delta", "base": 12}}``: names may repeat in a Spark struct, positions
do not); a field not named there is stored as its schema says. Arithmetic is exact: ranges are
checked with Python integers before numpy computes, nothing wraps.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ENCODINGS_KEY = b"state_runtime.encodings"
_NARROW = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_KINDS = ("delta", "offset")

SMALL = 64
"""Fields of at most this many values are encoded and decoded in Python: a tiny file's few
values cost a few microseconds so, against about 70 for the Arrow compute calls of the
general path (their fixed cost per call is most of a tiny file's encode and decode). Same
checks, same errors, same values."""


def _narrowest(low: int, high: int) -> pa.DataType:
    """The narrowest signed integer type holding ``low..high``."""
    for t in _NARROW:
        bits = t.bit_width - 1
        if -(1 << bits) <= low and high < (1 << bits):
            return t
    raise OverflowError(f"{low}..{high} does not fit in 64 bits")


@dataclass
class FieldStats:
    """What choosing one integer field's encoding needs, gathered a piece of its column at a
    time (pieces in row order)."""

    rows: int = 0
    nulls: int = 0
    low: int = 0
    high: int = 0
    first: int | None = None
    last: int | None = None
    ascending: bool = True
    max_step: int = 0

    def add(self, column: pa.Array) -> None:
        seen = self.rows > self.nulls  # values before this piece
        self.rows += len(column)
        self.nulls += column.null_count
        if column.null_count == len(column):
            return
        if len(column) <= SMALL:
            self._add_small(column.to_pylist(), seen)
            return
        as_int64 = column.cast(pa.int64())
        low, high = (int(x.as_py()) for x in pc.min_max(as_int64).values())
        self.low, self.high = (min(self.low, low), max(self.high, high)) if seen else (low, high)
        if not self.ascending or self.nulls or self.high - self.low >= 1 << 63:
            self.ascending = False  # no delta: nulls, or a range that leaves no encoding at all
            return
        values = np.asarray(as_int64.to_numpy(), dtype=np.int64)
        previous = values[:1] if self.last is None else np.array([self.last], dtype=np.int64)
        steps = np.diff(values, prepend=previous)  # exact: the range is below 2**63
        self.ascending = int(steps.min()) >= 0
        self.max_step = max(self.max_step, int(steps.max()))
        self.first = int(values[0]) if self.first is None else self.first
        self.last = int(values[-1])

    def _add_small(self, stored: list[int | None], seen: bool) -> None:
        """:meth:`add` of a short piece (``stored``, not all null), in Python integers."""
        present = [x for x in stored if x is not None]
        low, high = min(present), max(present)
        self.low, self.high = (min(self.low, low), max(self.high, high)) if seen else (low, high)
        if not self.ascending or self.nulls or self.high - self.low >= 1 << 63:
            self.ascending = False
            return
        previous = present[0] if self.last is None else self.last
        steps = [b - a for a, b in zip([previous, *present], present, strict=False)]
        self.ascending = min(steps) >= 0
        self.max_step = max(self.max_step, max(steps))
        self.first = present[0] if self.first is None else self.first
        self.last = present[-1]

    def choice(self, field_type: pa.DataType, *, delta: bool) -> _Choice | None:
        """How to store the field narrow, or None when that would not be narrower."""
        if self.rows == 0 or self.nulls == self.rows or self.high - self.low >= 1 << 63:
            return None
        if delta and not self.nulls and self.ascending and self.first is not None:
            stored_type = _narrowest(0, self.max_step)
            if stored_type.bit_width < field_type.bit_width:
                return _Choice(stored_type, {"kind": "delta", "base": self.first})
        stored_type = _narrowest(0, self.high - self.low)
        if stored_type.bit_width >= field_type.bit_width:
            return None
        return _Choice(stored_type, {"kind": "offset", "base": self.low})


@dataclass(frozen=True)
class _Choice:
    stored_type: pa.DataType
    spec: dict[str, Any]

    def encode(self, column: pa.Array, previous: int | None) -> pa.Array:
        """A piece of the column stored narrow; ``previous``: the value before it (delta)."""
        if len(column) <= SMALL:  # in Python integers: see SMALL
            stored: list[int | None] = column.to_pylist()
            if self.spec["kind"] == "delta":
                present = [int(x) for x in stored if x is not None]
                start = present[:1] if previous is None else [previous]
                stored = [b - a for a, b in zip(start + present, present, strict=False)]
            else:
                base = self.spec["base"]
                stored = [None if x is None else x - base for x in stored]
            return pa.array(stored, type=self.stored_type)
        as_int64 = column.cast(pa.int64())
        if self.spec["kind"] == "delta":
            values = np.asarray(as_int64.to_numpy(), dtype=np.int64)
            before = values[:1] if previous is None else np.array([previous], dtype=np.int64)
            steps = np.diff(values, prepend=before)
            return pa.array(steps.astype(self.stored_type.to_pandas_dtype()), type=self.stored_type)
        base = pa.scalar(self.spec["base"], pa.int64())
        return pc.subtract(as_int64, base).cast(self.stored_type)


class TableEncoder:
    """:func:`encode_table` over rows given a piece at a time, in two passes: every piece
    through :meth:`add`, then :meth:`choose`, then every piece again, in the same order,
    through :meth:`encode`. The encodings are those of the whole table."""

    def __init__(self, key_type: pa.StructType, value_type: pa.StructType, *, in_key_order: bool):
        self._fields = {
            f"{name}.{i}": FieldStats()
            for name, struct in (("key", key_type), ("value", value_type))
            for i, field in enumerate(struct)
            if pa.types.is_integer(field.type) and not pa.types.is_unsigned_integer(field.type)
        }
        self._types = {"key": key_type, "value": value_type}
        self._in_key_order = in_key_order
        self._chosen: dict[str, _Choice] = {}
        self._last: dict[str, int] = {}

    def add(self, keys: pa.StructArray, values: pa.StructArray) -> None:
        for name, struct in (("key", keys), ("value", values)):
            for i in range(struct.type.num_fields):
                stats = self._fields.get(f"{name}.{i}")
                if stats is not None:
                    stats.add(struct.field(i))

    def choose(self) -> dict[str, Any]:
        """The encodings, as the file's metadata records them."""
        for path, stats in self._fields.items():
            name, i = path.split(".")
            delta = path == "key.0" and self._in_key_order
            choice = stats.choice(self._types[name].field(int(i)).type, delta=delta)
            if choice is not None:
                self._chosen[path] = choice
        return {path: choice.spec for path, choice in self._chosen.items()}

    def encode(self, keys: pa.StructArray, values: pa.StructArray) -> pa.Table:
        """A piece of the rows with its integer fields stored as chosen."""
        columns = []
        for name, struct in (("key", keys), ("value", values)):
            children = [struct.field(i) for i in range(struct.type.num_fields)]
            narrowed = False
            for i in range(len(children)):
                choice = self._chosen.get(f"{name}.{i}")
                if choice is None:
                    continue
                path = f"{name}.{i}"
                stored = choice.encode(children[i], self._last.get(path))
                if choice.spec["kind"] == "delta" and len(children[i]):
                    self._last[path] = int(children[i][-1].as_py())
                children[i] = stored
                narrowed = True
            columns.append(_with_children(struct, children) if narrowed else struct)
        return pa.table({"key": columns[0], "value": columns[1]})


def encode_table(table: pa.Table, *, in_key_order: bool) -> tuple[pa.Table, dict[str, Any]]:
    """The ``key``/``value`` table with its integer fields stored narrow, and the encodings."""
    keys = table.column("key").combine_chunks()
    values = table.column("value").combine_chunks()
    encoder = TableEncoder(keys.type, values.type, in_key_order=in_key_order)
    encoder.add(keys, values)
    encodings = encoder.choose()
    return encoder.encode(keys, values), encodings


def _with_children(struct: pa.StructArray, children: list[pa.Array]) -> pa.StructArray:
    """``struct`` with ``children`` in place of its fields' arrays (names, nullability and the
    struct's own nulls kept)."""
    fields = [
        pa.field(f.name, c.type, f.nullable) for f, c in zip(struct.type, children, strict=True)
    ]
    mask = struct.is_null() if struct.null_count else None
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def decode_table(
    table: pa.Table,
    raw: bytes | dict[str, Any] | None,
    key_type: pa.StructType,
    value_type: pa.StructType,
    carry: dict[str, int] | None = None,
) -> pa.Table:
    """The inverse of :func:`encode_table`, given the encodings as JSON (format 2) or parsed
    (format 3). Raises ValueError on encodings that do not fit the table or the schemas (the
    caller reports the file as corrupt).

    A file's record batches decoded one at a time share one ``carry``: a ``delta`` field's
    first step in a later batch counts from the previous batch's last value, which ``carry``
    holds by field."""
    if raw is None:
        return table
    encodings = dict(raw) if isinstance(raw, dict) else json.loads(raw)
    if not isinstance(encodings, dict):
        raise ValueError("encodings are not a JSON object")
    if table.column_names != ["key", "value"]:
        return table  # the layout check names the problem
    columns = []
    for name, logical in (("key", key_type), ("value", value_type)):
        struct = table.column(name).combine_chunks()
        if not pa.types.is_struct(struct.type) or struct.type.num_fields != logical.num_fields:
            return table
        specs = [encodings.pop(f"{name}.{i}", None) for i in range(logical.num_fields)]
        if not any(specs):
            columns.append(struct)  # stored as the schema says (the layout check confirms)
            continue
        children = [
            struct.field(i)
            if spec is None
            else _decode_field(
                struct.field(i),
                spec,
                field,
                first_key=name == "key" and i == 0,
                carry=carry,
                name=f"{name}.{i}",
            )
            for i, (field, spec) in enumerate(zip(logical, specs, strict=True))
        ]
        columns.append(_with_children(struct, children))
    if encodings:
        raise ValueError(f"encodings for fields the schema does not have: {sorted(encodings)}")
    return pa.table({"key": columns[0], "value": columns[1]})


def _decode_field(
    child: pa.Array,
    spec: Any,
    field: pa.Field,
    *,
    first_key: bool,
    carry: dict[str, int] | None = None,
    name: str = "",
) -> pa.Array:
    where = f"field {field.name!r}"
    base = _checked_base(spec, child.type, field, where)
    if len(child) <= SMALL:
        stored: list[int | None] = child.to_pylist()
        decoded = _small_values(stored, spec["kind"], base, where, carry, name, first_key)
        return _small_array(decoded, field, where)
    if spec["kind"] == "delta":
        if not first_key or child.null_count:
            raise ValueError(f"{where}: delta encoding on a field that cannot have it")
        steps = np.asarray(child.to_numpy())
        continued = carry is not None and name in carry
        if continued:
            assert carry is not None
            base = carry[name]  # this batch's steps go on from the previous batch's last value
        if len(steps) and ((steps[0] != 0 and not continued) or int(steps.min()) < 0):
            raise ValueError(f"{where}: delta steps must start at 0 and not be negative")
        if len(steps) and base + int(steps.sum(dtype=np.int64)) >= 1 << 63:
            raise ValueError(f"{where}: delta values overflow 64 bits")
        total = np.cumsum(steps, dtype=np.int64)
        total += np.int64(base)
        if carry is not None and len(total):
            carry[name] = int(total[-1])
        values = pa.array(total, type=pa.int64())
    else:
        low, high = (x.as_py() for x in pc.min_max(child).values())
        if low is not None and not (base + low >= -(1 << 63) and base + high < 1 << 63):
            raise ValueError(f"{where}: offset values overflow 64 bits")
        values = pc.add(child.cast(pa.int64()), pa.scalar(base, pa.int64()))
    if values.type == field.type:
        return values
    try:
        return values.cast(field.type)  # safe cast: out of the field's range raises
    except pa.ArrowInvalid as e:
        raise ValueError(f"{where}: decoded values do not fit {field.type}: {e}") from e


def _checked_base(spec: Any, stored: pa.DataType, field: pa.Field, where: str) -> int:
    """The base of a field's encoding ``spec``, once the spec, the stored type and the
    field's type are checked to fit one another."""
    if not isinstance(spec, dict) or spec.get("kind") not in _KINDS:
        raise ValueError(f"{where}: unknown encoding {spec!r}")
    base = spec.get("base")
    if isinstance(base, bool) or not isinstance(base, int):
        raise ValueError(f"{where}: encoding base {base!r} is not an integer")
    if not pa.types.is_integer(field.type) or stored not in _NARROW:
        raise ValueError(f"{where}: {stored} cannot encode {field.type}")
    if stored.bit_width >= field.type.bit_width:
        raise ValueError(f"{where}: stored as {stored}, not narrower than {field.type}")
    if not -(1 << 63) <= base < (1 << 63):
        raise ValueError(f"{where}: encoding base {base} does not fit in 64 bits")
    return base


def _small_values(
    stored: list[int | None],
    kind: str,
    base: int,
    where: str,
    carry: dict[str, int] | None,
    name: str,
    first_key: bool,
) -> list[int | None]:
    """A short field's ``stored`` values decoded, in Python integers (see :data:`SMALL`)."""
    if kind == "delta":
        if not first_key or None in stored:
            raise ValueError(f"{where}: delta encoding on a field that cannot have it")
        steps = [int(x) for x in stored if x is not None]
        continued = carry is not None and name in carry
        if continued:
            assert carry is not None
            base = carry[name]
        if steps and ((steps[0] != 0 and not continued) or min(steps) < 0):
            raise ValueError(f"{where}: delta steps must start at 0 and not be negative")
        if steps and base + sum(steps) >= 1 << 63:
            raise ValueError(f"{where}: delta values overflow 64 bits")
        decoded: list[int | None] = []
        total = base
        for step in steps:
            total += step
            decoded.append(total)
        if carry is not None and decoded:
            carry[name] = total
        return decoded
    present = [x for x in stored if x is not None]
    if present and not (base + min(present) >= -(1 << 63) and base + max(present) < 1 << 63):
        raise ValueError(f"{where}: offset values overflow 64 bits")
    return [None if x is None else x + base for x in stored]


def _small_array(decoded: list[int | None], field: pa.Field, where: str) -> pa.Array:
    """Decoded Python integers as the field's array; ValueError when one does not fit it."""
    try:
        return pa.array(decoded, type=field.type)  # out of the field's range raises
    except (pa.ArrowInvalid, OverflowError) as e:
        raise ValueError(f"{where}: decoded values do not fit {field.type}: {e}") from e


def decode_small_tables(
    tables: list[pa.Table],
    encodings: list[dict[str, Any]],
    key_type: pa.StructType,
    value_type: pa.StructType,
) -> pa.Table:
    """:func:`decode_table` of each of ``tables`` (format 3 rows as stored, at most
    :data:`SMALL` each, of one stored schema, the same fields encoded in each), the results
    concatenated: a few Arrow calls for all where each table alone takes a few a field. Each
    table's values go through the same checks as alone; a ValueError does not say which
    table failed (decode each alone to name it)."""
    if any(t.num_rows > SMALL for t in tables):
        raise ValueError(f"a table of more than {SMALL} rows")
    whole = pa.concat_tables(tables)
    ends = list(itertools.accumulate(t.num_rows for t in tables))
    starts = [0, *ends[:-1]]
    left = [dict(e) for e in encodings]
    columns = []
    for name, logical in (("key", key_type), ("value", value_type)):
        struct = whole.column(name).combine_chunks()
        if not pa.types.is_struct(struct.type) or struct.type.num_fields != logical.num_fields:
            raise ValueError(f"column {name!r} does not have the schema's fields")
        children = [struct.field(i) for i in range(logical.num_fields)]
        for i, field in enumerate(logical):
            code = f"{name}.{i}"
            specs = [e.pop(code, None) for e in left]
            if all(spec is None for spec in specs):
                continue  # a falsy spec other than None is checked (and refused): never
                # accepted where decoding alone refuses it, and a refusal here decodes alone
            where = f"field {field.name!r}"
            stored: list[int | None] = children[i].to_pylist()
            decoded: list[int | None] = []
            first_key = name == "key" and i == 0
            for spec, start, end in zip(specs, starts, ends, strict=True):
                base = _checked_base(spec, children[i].type, field, where)
                part = stored[start:end]
                decoded += _small_values(part, spec["kind"], base, where, None, code, first_key)
            children[i] = _small_array(decoded, field, where)
        columns.append(_with_children(struct, children))
    if any(left):
        raise ValueError("encodings for fields the schema does not have")
    return pa.table({"key": columns[0], "value": columns[1]})
