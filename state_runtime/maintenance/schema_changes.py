"""Schema changes as operators see them: each recorded change with its batch, and a check of a
planned change before a deployment (``statestore schema-check``), from the catalog alone."""

from __future__ import annotations

from dataclasses import dataclass, field

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument, SchemaMismatch
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema


@dataclass(frozen=True)
class SchemaChangeRow:
    """One entry of an operator store's schema history: the schema, from which batch, and
    what changed from the entry before."""

    root: str
    operator_id: int
    store_name: str
    schema_id: str
    from_batch: int
    key_schema: str
    value_schema: str
    actions: list[str]


@dataclass(frozen=True)
class SchemaCheck:
    """Whether a planned schema change is allowed, and what it will do."""

    root: str
    query_id: str
    operator_id: int
    store_name: str
    allowed: bool
    from_batch: int
    current: str
    proposed: str
    actions: list[str] = field(default_factory=list)
    reason: str | None = None


def _ddl(schema: StateSchema) -> tuple[str, str]:
    return schema.key.simpleString()[7:-1], schema.value.simpleString()[7:-1]


def schema_changes(catalog: Catalog, roots: list[str]) -> list[SchemaChangeRow]:
    """Every operator store's schema history below ``roots``, oldest entry first."""
    rows = []
    for root in roots:
        for (operator_id, store_name), history in sorted(catalog.schema_histories(root).items()):
            for entry, projection in history.changes():
                key, value = _ddl(entry.schema)
                actions = ["first schema"] if projection is None else list(projection.actions)
                rows.append(
                    SchemaChangeRow(
                        root,
                        operator_id,
                        store_name,
                        entry.schema_id,
                        entry.from_batch,
                        key,
                        value,
                        actions or ["no field changes (field metadata only)"],
                    )
                )
    return rows


def check_schema_change(
    catalog: Catalog,
    root: str,
    query_id: str,
    operator_id: int,
    store_name: str,
    value_schema: str,
    change: SchemaChange,
    key_schema: str | None = None,
) -> SchemaCheck:
    """Plan ``value_schema`` (and ``key_schema``, default the recorded one) with ``change``
    against the operator store's recorded history, as the query's next batch would."""
    history: SchemaHistory | None = catalog.schema_history(root, operator_id, store_name)
    if history is None:
        raise InvalidArgument(
            f"the catalog records no schema for operator {operator_id}, store {store_name} "
            f"below {root}"
        )
    newest = history.newest.schema
    proposed = StateSchema.of(key_schema or newest.key, value_schema)
    last = catalog.commit_history(root, query_id=query_id, limit=1)
    from_batch = last[0].batch_id + 1 if last else 0
    current = "key <{}>, value <{}>".format(*_ddl(newest))
    wanted = "key <{}>, value <{}>".format(*_ddl(proposed))
    common = (root, query_id, operator_id, store_name)
    try:
        _, projection = history.evolve(proposed, change, from_batch)
    except SchemaMismatch as e:
        return SchemaCheck(*common, False, from_batch, current, wanted, reason=e.reason)
    actions = ["no change: this is the recorded schema"] if projection is None else []
    return SchemaCheck(
        *common,
        True,
        from_batch,
        current,
        wanted,
        actions + ([] if projection is None else list(projection.actions)),
    )
