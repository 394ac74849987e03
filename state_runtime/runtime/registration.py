"""A query's registration, planned before its first batch from one read of the catalog.

The driver reads what the catalog holds for the root (``Catalog.registered``: schema
histories, stores and layouts), refuses a partition count other than the recorded layout's and
a schema change the planner refuses, before anything is written or any task runs, then records
every operator's stores, layout and history in one write (``Catalog.register_query``). This
module plans that write; ``query.py`` runs the read and the write.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import StructType

from state_runtime.catalog import NewLayout, OperatorRegistration, Registered
from state_runtime.errors import InvalidArgument, SchemaMismatch
from state_runtime.identity import StoreId
from state_runtime.maintenance.restore import run_step, spark_checkpoint_option
from state_runtime.runtime.operator import ExtraStore, StatefulOperator
from state_runtime.store.schema_history import SchemaEntry, SchemaHistory

OperatorStore = tuple[int, str]


def stores_of(operators: Sequence[StatefulOperator]) -> list[tuple[StatefulOperator, ExtraStore]]:
    """Every store of every operator, with its operator."""
    return [(op, store) for op in operators for store in op.stores]


def planned_histories(
    query_id: str,
    root: str,
    operators: Sequence[StatefulOperator],
    batch_id: int,
    recorded: dict[OperatorStore, SchemaHistory],
) -> dict[OperatorStore, SchemaHistory]:
    """Each operator's schema history with its declared schema as the newest, planned
    against the catalog's (SchemaMismatch naming every refused field)."""
    planned = {}
    for op, store in stores_of(operators):
        key = (op.operator_id, store.name)
        known = recorded.get(key)
        if known is None:
            planned[key] = SchemaHistory((SchemaEntry.make(store.schema, from_batch=batch_id),))
            continue
        try:
            change = store.change_from(known.newest.schema)
            planned[key], _ = known.evolve(store.schema, change, batch_id)
        except SchemaMismatch as e:
            raise SchemaMismatch(
                f"query {query_id}, {store.describe(op)}: {e.reason}", path=root
            ) from None
    return planned


def routings(
    operators: Sequence[StatefulOperator], schema: StructType
) -> list[list[dict[str, Any]] | None]:
    """Each operator's routing: its key columns and their Spark types in its input (the
    batch's input for the first, the previous operator's output for the others); None
    when a key column is missing (the batch then fails on it before any task runs)."""
    found: list[list[dict[str, Any]] | None] = []
    for op in operators:
        types = {f.name: f.dataType for f in schema.fields}
        found.append(
            [{"column": c, "type": types[c].simpleString()} for c in op.key_columns]
            if all(c in types for c in op.key_columns)
            else None
        )
        schema = op.output_struct
    return found


def _check_partitions(
    query_id: str,
    root: str,
    spark_checkpoint: str | None,
    operators: Sequence[StatefulOperator],
    registered: Registered,
    existing: dict[OperatorStore, set[int]],
) -> None:
    """Refuse an operator whose partition count is not the catalog's (its layout's, or the
    partitions registered before layouts were recorded), naming the repartition command."""
    for op, spec in stores_of(operators):
        key = (op.operator_id, spec.name)
        layout = registered.layouts.get(key)
        count = layout.num_partitions if layout else len(existing.get(key, set()))
        found = set(range(count)) if layout else existing.get(key, set())
        if found and found != set(range(op.num_partitions)):
            raise InvalidArgument(
                f"operator {op.operator_id} (store {spec.name}) of query {query_id} "
                f"has {count} state partitions in the catalog; it cannot run with "
                f"{op.num_partitions}. Keep num_partitions={count}, or stop the query and "
                + run_step(
                    f"statestore repartition {root} --query {query_id} --operator "
                    f"{op.operator_id} --partitions {op.num_partitions} "
                    f"{spark_checkpoint_option(spark_checkpoint)}"
                )
                + " (a dry run; then with --execute; docs/repartition.md)"
            )


def plan_registration(
    query_id: str,
    root: str,
    spark_checkpoint: str | None,
    operators: Sequence[StatefulOperator],
    batch_id: int,
    schema: StructType,
    registered: Registered,
) -> tuple[list[OperatorRegistration], dict[OperatorStore, SchemaHistory]]:
    """What ``register_query`` records for ``operators`` (already opened against the
    catalog's histories) and the schema histories planned; refusals before any write."""
    existing: defaultdict[OperatorStore, set[int]] = defaultdict(set)
    for store in (record.key.store for record in registered.stores):
        existing[store.operator_id, store.store_name].add(store.partition_id)
    _check_partitions(query_id, root, spark_checkpoint, operators, registered, existing)
    histories = planned_histories(query_id, root, operators, batch_id, registered.histories)
    routed = dict(zip(map(id, operators), routings(operators, schema), strict=True))
    planned = []
    for op, spec in stores_of(operators):
        key, routing = (op.operator_id, spec.name), routed[id(op)]
        new = sorted(set(range(op.num_partitions)) - existing[key])
        first = None
        if key not in registered.layouts and routing is not None:
            first = NewLayout(op.operator_id, spec.name, op.num_partitions, routing)
        planned.append(
            OperatorRegistration(
                *key,
                [StoreId(op.operator_id, p, spec.name) for p in new],
                spec.schema.key.jsonValue(),
                spec.schema.value.jsonValue(),
                first,
                histories[key],
            )
        )
    return planned, histories
