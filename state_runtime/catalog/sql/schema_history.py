"""The SQL of schema histories: ``state_schemas`` (each schema by id) and ``operator_schemas``
(each operator store's schemas in order, with the batch from which they apply)."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import operator_schemas, state_schemas, stores
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.errors import CommitConflict
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaEntry, SchemaHistory
from state_runtime.store.state_schema import StateSchema

OperatorStore = tuple[int, str]
"""(operator id, store name): the stores of all partitions of an operator share a history."""


@functools.cache
def _history_queries(views: ReaderViews, one: bool) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """:func:`histories`' statements (the recorded entries, the registered schemas), built
    once per shape: the root and, for ``one`` operator store, its ``operator_id`` and
    ``store_name`` are bind parameters."""
    o, s, st = views.operator_schemas.c, views.state_schemas.c, views.stores.c
    root = sa.bindparam("root", type_=st.checkpoint_root.type)
    operator_id = sa.bindparam("operator_id", type_=st.operator_id.type)
    store_name = sa.bindparam("store_name", type_=st.store_name.type)
    where, registered_where = [o.checkpoint_root == root], [st.checkpoint_root == root]
    if one:
        where += [o.operator_id == operator_id, o.store_name == store_name]
        registered_where += [st.operator_id == operator_id, st.store_name == store_name]
    recorded = (
        sa.select(
            o.operator_id,
            o.store_name,
            o.from_batch,
            s.schema_id,
            s.parent_id,
            s.key_schema,
            s.value_schema,
            s.change,
        )
        .join(views.state_schemas, s.schema_id == o.schema_id)
        .where(*where)
        .order_by(o.operator_id, o.store_name, o.seq)
    )
    registered = (  # as text: only the first usable row of each operator store is parsed
        sa.select(
            st.operator_id,
            st.store_name,
            sa.cast(st.key_schema, sa.Text).label("key_schema"),
            sa.cast(st.value_schema, sa.Text).label("value_schema"),
        )
        .where(*registered_where, st.key_schema.is_not(None))
        .order_by(st.operator_id, st.store_name, st.partition_id)
    )
    return recorded, registered


def histories(
    connection: Connection, views: ReaderViews, root: str, only: OperatorStore | None = None
) -> dict[OperatorStore, SchemaHistory]:
    """Every recorded history below ``root`` (or only that of ``only``); an operator store
    registered before histories existed gets its registered schemas as a one-entry history
    (not recorded yet)."""
    validate_root(root)
    recorded, registered_query = _history_queries(views, only is not None)
    values: dict[str, Any] = {"root": root}
    if only is not None:
        values.update(operator_id=only[0], store_name=only[1])
    rows = connection.execute(recorded, values).all()
    entries: dict[OperatorStore, list[SchemaEntry]] = defaultdict(list)
    for r in rows:
        entries[r.operator_id, r.store_name].append(
            SchemaEntry(
                r.schema_id,
                StateSchema.of(r.key_schema, r.value_schema),
                r.parent_id,
                SchemaChange.from_json(r.change),
                int(r.from_batch),
            )
        )
    found = {key: SchemaHistory(tuple(e)) for key, e in entries.items()}
    for store in connection.execute(registered_query, values):
        key = (store.operator_id, store.store_name)
        if key in found or store.value_schema is None:
            continue
        value_schema = json.loads(store.value_schema)  # JSON null: not registered here
        if value_schema is not None:
            key_schema = json.loads(store.key_schema)
            found[key] = SchemaHistory.of(StateSchema.of(key_schema, value_schema))
    return found


def record_history(
    connection: Connection,
    root: str,
    operator_id: int,
    store_name: str,
    history: SchemaHistory,
    now: datetime,
) -> None:
    """Record the entries of ``history`` not recorded yet; the recorded ones must be its
    prefix (else another driver changed the schema meanwhile: CommitConflict). The stores'
    registered schemas become the newest."""
    validate_root(root)
    o = operator_schemas.c
    where = sa.and_(
        o.checkpoint_root == root, o.operator_id == operator_id, o.store_name == store_name
    )
    recorded = list(
        connection.execute(sa.select(o.schema_id).where(where).order_by(o.seq)).scalars()
    )
    ids = history.ids
    if recorded != ids[: len(recorded)]:
        raise CommitConflict(
            f"the schema history of operator {operator_id} (store {store_name}) below {root} "
            f"changed meanwhile: recorded {recorded}, this driver has {ids}"
        )
    for seq, entry in list(enumerate(history.entries))[len(recorded) :]:
        known = connection.execute(
            sa.select(state_schemas.c.schema_id).where(state_schemas.c.schema_id == entry.schema_id)
        ).first()
        if known is None:
            connection.execute(
                state_schemas.insert().values(
                    schema_id=entry.schema_id,
                    parent_id=entry.parent_id,
                    key_schema=entry.schema.key.jsonValue(),
                    value_schema=entry.schema.value.jsonValue(),
                    change=entry.change.to_json(),
                    created_at=now,
                )
            )
        connection.execute(
            operator_schemas.insert().values(
                checkpoint_root=root,
                operator_id=operator_id,
                store_name=store_name,
                seq=seq,
                schema_id=entry.schema_id,
                from_batch=entry.from_batch,
                recorded_at=now,
            )
        )
    newest = history.newest.schema
    st = stores.c
    connection.execute(
        stores.update()
        .where(
            st.checkpoint_root == root, st.operator_id == operator_id, st.store_name == store_name
        )
        .values(key_schema=newest.key.jsonValue(), value_schema=newest.value.jsonValue())
    )
