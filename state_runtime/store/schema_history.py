"""A store's schema history: every schema it has been written with, in order, by id.

Each entry is a schema, the declared change that led to it from the entry before, and the
first batch that ran under it. Its id is a fingerprint of all three plus the previous id, so
an id names one point of one history (a field dropped and later re-added under the same name
gets a new id: rows written before the drop do not come back). Checkpoint files name the id
they were written with; loading a file plans (once per id) and applies the projection from
its entry to the newest. The catalog keeps the history (``state_schemas``,
``operator_schemas``); the driver ships it to the tasks with the operator.

A file whose id the history does not know (written before schema ids existed, or by a
provider opened without the catalog) is read through the oldest entry with the same fields,
or else planned directly from its own schema with nothing declared (additions and widenings).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from state_runtime.errors import InvalidArgument, SchemaMismatch
from state_runtime.store.schema_evolution import Projection, SchemaChange, plan, same_schema
from state_runtime.store.state_schema import StateSchema


def schema_id(schema: StateSchema, parent_id: str | None, change: SchemaChange) -> str:
    """The id of a history entry: 32 hex digits of SHA-256 over its canonical JSON."""
    canonical = json.dumps(
        {
            "key": schema.key.jsonValue(),
            "value": schema.value.jsonValue(),
            "parent": parent_id,
            "change": change.to_json(),
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SchemaEntry:
    """One schema of a store's history and how it came to be."""

    schema_id: str
    schema: StateSchema
    parent_id: str | None = None
    change: SchemaChange = field(default_factory=SchemaChange)
    from_batch: int = 0
    """The first batch that ran under this schema (it commits version ``from_batch + 1``)."""

    @classmethod
    def make(
        cls,
        schema: StateSchema,
        parent_id: str | None = None,
        change: SchemaChange | None = None,
        from_batch: int = 0,
    ) -> SchemaEntry:
        change = change or SchemaChange()
        return cls(schema_id(schema, parent_id, change), schema, parent_id, change, from_batch)


@dataclass(frozen=True)
class SchemaHistory:
    """The entries of one store's (one operator's) schema history, oldest first."""

    entries: tuple[SchemaEntry, ...]
    _projections: dict[str | None, Projection] = field(
        default_factory=dict, compare=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.entries:
            raise InvalidArgument("a schema history needs at least one schema")

    def __getstate__(self) -> dict[str, Any]:
        return {"entries": self.entries}  # shipped to tasks without its cache and lock

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "entries", state["entries"])
        object.__setattr__(self, "_projections", {})
        object.__setattr__(self, "_lock", threading.Lock())

    @classmethod
    def of(cls, schema: StateSchema) -> SchemaHistory:
        """A history of one schema (a store opened without the catalog)."""
        return cls((SchemaEntry.make(schema),))

    @property
    def newest(self) -> SchemaEntry:
        return self.entries[-1]

    @property
    def ids(self) -> list[str]:
        return [e.schema_id for e in self.entries]

    def schema_of(self, schema_id: str) -> StateSchema | None:
        """The schema of entry ``schema_id``, or None if this history has no such entry: how a
        format 3 delta, which names its schema by id only, finds it."""
        return next((e.schema for e in self.entries if e.schema_id == schema_id), None)

    def up_to(self, schema_id: str) -> SchemaHistory:
        """The history as it was when ``schema_id`` was the newest."""
        if schema_id not in self.ids:
            raise InvalidArgument(f"schema {schema_id} is not in this store's history")
        return SchemaHistory(self.entries[: self.ids.index(schema_id) + 1])

    def at_batch(self, batch_id: int) -> SchemaEntry:
        """The schema batch ``batch_id`` ran under."""
        ran = [e for e in self.entries if e.from_batch <= batch_id]
        return ran[-1] if ran else self.entries[0]

    def evolve(
        self, schema: StateSchema, change: SchemaChange | None, from_batch: int
    ) -> tuple[SchemaHistory, Projection | None]:
        """This history with ``schema`` appended (planned from the newest; SchemaMismatch if
        refused) and the projection, or itself and None when ``schema`` is the newest."""
        newest = self.newest
        if same_schema(newest.schema, schema):
            return self, None
        projection = plan(newest.schema, schema, change)
        entry = SchemaEntry.make(schema, newest.schema_id, change, from_batch)
        return SchemaHistory((*self.entries, entry)), projection

    def projection(self, file_schema_id: str | None, file_schema: StateSchema) -> Projection:
        """How rows of a file written under ``file_schema`` (with that id, if it has one) read
        under the newest schema. Planned once per id; SchemaMismatch if they cannot."""
        with self._lock:
            found = self._projections.get(file_schema_id)
        if found is not None and same_schema(found.source, file_schema):
            return found
        found = self._plan(file_schema_id, file_schema)
        with self._lock:
            self._projections[file_schema_id] = found
        return found

    def entry_of(self, file_schema_id: str | None, file_schema: StateSchema) -> SchemaEntry | None:
        """The entry a file was written under: the one it names, else (a file without a known
        id) the oldest with the same fields; None if there is none. SchemaMismatch if the file
        names an entry but holds other fields."""
        for entry in self.entries:
            if entry.schema_id == file_schema_id:
                if not same_schema(entry.schema, file_schema):
                    raise SchemaMismatch(
                        f"the file names schema {file_schema_id} but holds "
                        f"<{file_schema.describe()}>, not <{entry.schema.describe()}>"
                    )
                return entry
        return next((e for e in self.entries if same_schema(e.schema, file_schema)), None)

    def _plan(self, file_schema_id: str | None, file_schema: StateSchema) -> Projection:
        entry = self.entry_of(file_schema_id, file_schema)
        if entry is None:
            return plan(file_schema, self.newest.schema)
        start = self.entries.index(entry)
        result = plan(file_schema, entry.schema)
        for later in self.entries[start + 1 :]:
            result = result.then(plan(result.target, later.schema, later.change))
        return result

    def changes(self) -> Sequence[tuple[SchemaEntry, Projection | None]]:
        """Each entry with the projection from the entry before (None for the first)."""
        return [
            (e, None if i == 0 else plan(self.entries[i - 1].schema, e.schema, e.change))
            for i, e in enumerate(self.entries)
        ]
