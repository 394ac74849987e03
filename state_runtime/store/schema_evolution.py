"""Planning a change of a store's schemas, and the projection that reads older rows under it.

A change is checked against declared intent, never guessed: renames (``renamed={"amount":
"total"}``) and drops (``dropped=("x",)``) are declared, so a field that disappears without a
declaration is refused. Allowed for value fields: add a nullable field or one with a declared
default, rename, widen (tinyint→smallint→int→bigint, float→double, decimal precision up; the
same inside structs, arrays and maps), drop. Key fields: rename only (their types drive routing
and ordering). :func:`plan` collects every problem and raises one :class:`SchemaMismatch` that
names each field and the rule it breaks; otherwise it returns a :class:`Projection`, which
turns key and value struct arrays written under the old schema into the new one in Arrow
(rename, cast, fill), with no Python object per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

from state_runtime.errors import InvalidArgument, SchemaMismatch
from state_runtime.store.state_schema import StateSchema

_INTEGER_RANK: dict[type[DataType], int] = {ByteType: 0, ShortType: 1, IntegerType: 2, LongType: 3}
WIDENING_RULE = (
    "allowed widenings: tinyint→smallint→int→bigint, float→double, decimal precision up "
    "(scale not down), the same inside structs, arrays and maps"
)


@dataclass(frozen=True)
class SchemaChange:
    """What a schema change declares beyond the new schema itself.

    ``renamed`` maps old field names to new ones (key or value fields); ``dropped`` names value
    fields removed on purpose; ``defaults`` gives the value rows written before read for an
    added value field (else null, which needs the field to be nullable).
    """

    renamed: Mapping[str, str] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        renamed, dropped, defaults = dict(self.renamed), tuple(self.dropped), dict(self.defaults)
        for name in [*renamed, *renamed.values(), *dropped, *defaults]:
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"schema change names fields by name, got {name!r}")
        object.__setattr__(self, "renamed", renamed)
        object.__setattr__(self, "dropped", dropped)
        object.__setattr__(self, "defaults", defaults)

    def __bool__(self) -> bool:
        return bool(self.renamed or self.dropped or self.defaults)

    def to_json(self) -> dict[str, Any]:
        return {
            "renamed": dict(sorted(self.renamed.items())),
            "dropped": sorted(self.dropped),
            "defaults": dict(sorted(self.defaults.items())),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SchemaChange:
        data = data or {}
        return cls(
            dict(data.get("renamed", {})),
            tuple(data.get("dropped", ())),
            dict(data.get("defaults", {})),
        )


@dataclass(frozen=True)
class Projection:
    """How rows written under ``source`` read under ``target``.

    ``value_sources[i]`` is the index in ``source``'s value struct that target value field
    ``i`` comes from, or None when it is filled with ``fills[i]`` (null unless declared).
    Key fields keep their positions and types (only their names may change).
    """

    source: StateSchema
    target: StateSchema
    value_sources: tuple[int | None, ...]
    fills: tuple[Any, ...]
    actions: tuple[str, ...] = ()

    @property
    def identity(self) -> bool:
        return self.source.key_arrow == self.target.key_arrow and (
            self.source.value_arrow == self.target.value_arrow
            and self.value_sources == tuple(range(len(self.value_sources)))
        )

    def apply(
        self, keys: pa.StructArray, values: pa.StructArray
    ) -> tuple[pa.StructArray, pa.StructArray]:
        """``keys`` and ``values`` (a null value: a removal) as the target schema has them."""
        if self.identity:
            return keys, values
        key_type, value_type = self.target.key_arrow, self.target.value_arrow
        if keys.type != key_type:
            keys = pa.StructArray.from_arrays(
                keys.flatten(),
                fields=list(key_type),
                mask=keys.is_null() if keys.null_count else None,
            )
        old = values.flatten()
        children = []
        for i, source in enumerate(self.value_sources):
            wanted = value_type.field(i).type
            if source is None:
                fill = self.fills[i]
                children.append(
                    pa.nulls(len(values), type=wanted)
                    if fill is None
                    else pa.repeat(fill_scalar(fill, wanted), len(values))
                )
            else:
                child = old[source]
                children.append(child if child.type == wanted else child.cast(wanted))
        mask = values.is_null() if values.null_count else None
        return keys, pa.StructArray.from_arrays(children, fields=list(value_type), mask=mask)

    def then(self, later: Projection) -> Projection:
        """This projection followed by ``later`` (whose source is this one's target)."""
        sources: list[int | None] = []
        fills: list[Any] = []
        for source, fill in zip(later.value_sources, later.fills, strict=True):
            if source is None:
                sources.append(None)
                fills.append(fill)
            else:
                sources.append(self.value_sources[source])
                fills.append(self.fills[source])
        return Projection(
            self.source, later.target, tuple(sources), tuple(fills), self.actions + later.actions
        )


def same_schema(a: StateSchema, b: StateSchema) -> bool:
    """Whether two schemas hold the same fields (field metadata aside)."""
    if a is b:  # the usual case: a format 3 delta's schema is its history's own
        return True
    return _strip(a.key) == _strip(b.key) and _strip(a.value) == _strip(b.value)


def plan(old: StateSchema, new: StateSchema, change: SchemaChange | None = None) -> Projection:
    """The projection from ``old`` to ``new`` under ``change``, or SchemaMismatch naming every
    field that breaks a rule (one message)."""
    change = change or SchemaChange()
    problems: list[str] = []
    actions: list[str] = []
    old_keys, new_keys = old.key.fields, new.key.fields
    old_values = {f.name: i for i, f in enumerate(old.value.fields)}
    new_values = {f.name for f in new.value.fields}
    problems += _declaration_problems(old, new, change)
    # Keys: same positions and types; a different name must be a declared rename.
    if len(old_keys) != len(new_keys):
        problems.append(
            f"key fields cannot be added or removed (key types drive routing and ordering): "
            f"<{_ddl(old.key)}> -> <{_ddl(new.key)}>"
        )
    for o, n in zip(old_keys, new_keys, strict=False):
        expected = change.renamed.get(o.name, o.name)
        if n.name != expected:
            problems.append(
                f"key field {o.name!r} is {n.name!r} in the new schema: an undeclared rename "
                f"(declare renamed={{{o.name!r}: {n.name!r}}})"
            )
        elif n.name != o.name:
            actions.append(f"rename key field {o.name} -> {n.name}")
        if o.dataType != n.dataType:
            problems.append(
                f"key field {o.name!r}: {o.dataType.simpleString()} -> "
                f"{n.dataType.simpleString()}: key types cannot change (they drive routing "
                "and ordering)"
            )
    # Values: every old field is kept (maybe renamed, widened) or declared dropped.
    origin: dict[str, int] = {}
    for name, i in old_values.items():
        o = old.value.fields[i]
        if name in change.dropped:
            actions.append(f"drop value field {name}")
            continue
        target = change.renamed.get(name, name)
        if target not in new_values:
            problems.append(
                f"value field {name!r} is missing from the new schema: an undeclared drop or "
                f"rename (declare dropped=[{name!r}] or renamed={{{name!r}: '<new name>'}})"
            )
            continue
        n = new.value[target]
        origin[target] = i
        if target != name:
            actions.append(f"rename value field {name} -> {target}")
        problem = _widening_problem(o.dataType, n.dataType)
        if problem:
            problems.append(f"value field {name!r}: {problem}")
        elif o.dataType != n.dataType:
            actions.append(
                f"widen value field {target}: {o.dataType.simpleString()} -> "
                f"{n.dataType.simpleString()}"
            )
        if o.nullable and not n.nullable:
            problems.append(
                f"value field {name!r}: nullable -> NOT NULL (rows written before may hold nulls)"
            )
    sources: list[int | None] = []
    fills: list[Any] = []
    for n in new.value.fields:
        if n.name in origin:
            sources.append(origin[n.name])
            fills.append(None)
            continue
        sources.append(None)
        default = change.defaults.get(n.name)
        fills.append(default)
        if default is not None:
            problems += _default_problems(n, new.value_arrow.field(n.name).type, default)
        elif not n.nullable:
            problems.append(
                f"value field {n.name!r} is added NOT NULL without a default (declare "
                f"defaults={{{n.name!r}: ...}} or make it nullable)"
            )
        what = "null" if default is None else repr(default)
        actions.append(
            f"add value field {n.name} {n.dataType.simpleString()} ({what} for older rows)"
        )
    if problems:
        rule = f" ({WIDENING_RULE})" if any("not a widening" in p for p in problems) else ""
        raise SchemaMismatch(
            f"schema change <{old.describe()}> -> <{new.describe()}> refused: "
            + "; ".join(dict.fromkeys(problems))
            + rule
        )
    return Projection(old, new, tuple(sources), tuple(fills), tuple(actions))


def _declaration_problems(old: StateSchema, new: StateSchema, change: SchemaChange) -> list[str]:
    """Declarations that name no such field, or contradict each other."""
    problems = []
    old_names = set(old.key.names) | set(old.value.names)
    new_names = set(new.key.names) | set(new.value.names)
    for source, target in change.renamed.items():
        if source not in old_names:
            problems.append(f"renamed {source!r} -> {target!r}: no field {source!r} to rename")
        if target not in new_names:
            problems.append(
                f"renamed {source!r} -> {target!r}: the new schema has no field {target!r}"
            )
        if (
            target in old.value.names
            and target not in change.dropped
            and target not in change.renamed
        ):
            problems.append(f"renamed {source!r} -> {target!r}: {target!r} is already a field")
    targets = list(change.renamed.values())
    for target in {t for t in targets if targets.count(t) > 1}:
        problems.append(f"several fields are renamed to {target!r}")
    for name in change.dropped:
        if name in old.key.names:
            problems.append(f"key field {name!r} cannot be dropped (keys may only be renamed)")
        elif name not in old.value.names:
            problems.append(f"dropped {name!r}: no such value field")
        if name in change.renamed:
            problems.append(f"{name!r} is declared both renamed and dropped")
    for name in change.defaults:
        if name not in new.value.names:
            problems.append(f"default for {name!r}: the new schema has no value field {name!r}")
    return problems


def _default_problems(target: StructField, arrow_type: pa.DataType, value: Any) -> list[str]:
    """Why ``value`` cannot fill ``target`` (as a one-item list), or nothing."""
    try:
        fill_scalar(value, arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        return [
            f"default {value!r} for value field {target.name!r} does not fit its type "
            f"{target.dataType.simpleString()} ({e})"
        ]
    return []


def fill_scalar(value: Any, arrow_type: pa.DataType) -> pa.Scalar:
    """A declared default (JSON: a number, string, bool, list or object) as a value of
    ``arrow_type``, converted by Arrow's safe cast (so ``"1.5"`` fills a decimal)."""
    return pa.array([value]).cast(arrow_type, safe=True)[0]


def _widening_problem(old: DataType, new: DataType) -> str | None:
    """Why ``new`` cannot hold every ``old`` value read as it, or None."""
    if old == new:
        return None
    bad = f"{old.simpleString()} -> {new.simpleString()} is not a widening"
    if type(old) in _INTEGER_RANK and type(new) in _INTEGER_RANK:
        return None if _INTEGER_RANK[type(new)] >= _INTEGER_RANK[type(old)] else bad
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return None
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        fits = new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
        return None if fits else bad
    if isinstance(old, StructType) and isinstance(new, StructType):
        if old.names != new.names:
            return f"{bad}: nested struct fields cannot be added, removed or renamed"
        for o, n in zip(old.fields, new.fields, strict=True):
            if o.nullable and not n.nullable:
                return f"{bad}: nested field {o.name!r} becomes NOT NULL"
        return _first(
            _widening_problem(o.dataType, n.dataType)
            for o, n in zip(old.fields, new.fields, strict=True)
        )
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        if old.containsNull and not new.containsNull:
            return f"{bad}: array elements become NOT NULL"
        return _widening_problem(old.elementType, new.elementType)
    if isinstance(old, MapType) and isinstance(new, MapType):
        if old.keyType != new.keyType:
            return f"{bad}: map key types cannot change"
        if old.valueContainsNull and not new.valueContainsNull:
            return f"{bad}: map values become NOT NULL"
        return _widening_problem(old.valueType, new.valueType)
    return bad


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)


def _ddl(schema: StructType) -> str:
    return schema.simpleString()[7:-1]


def _strip(schema: StructType) -> StructType:
    """The schema without field metadata, which does not affect stored data."""
    return StructType([StructField(f.name, f.dataType, f.nullable) for f in schema.fields])
