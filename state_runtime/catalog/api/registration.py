"""Catalog calls of a query's start: what it plans its stores, layouts and schema histories
against, read in one transaction, and what it records of them, in one (a driver's start paid
seven before: three reads, one repeated, and one write of each kind for each operator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.transactions import CatalogBase, conflict
from state_runtime.catalog.records import Layout, NewLayout, StoreRecord
from state_runtime.catalog.sql import inventory, layouts
from state_runtime.catalog.sql import schema_history as schema_history_sql
from state_runtime.catalog.sql.schema_history import OperatorStore
from state_runtime.identity import StoreId
from state_runtime.store.schema_history import SchemaHistory


@dataclass(frozen=True)
class Registered:
    """What the catalog holds below a root when a query starts, read at one moment."""

    histories: dict[OperatorStore, SchemaHistory]
    stores: list[StoreRecord]
    layouts: dict[OperatorStore, Layout]


@dataclass(frozen=True)
class OperatorRegistration:
    """What a query's start records of one operator store: its new partitions' stores (with
    their key and value schemas), its first layout (None: it has one, or no routing) and
    its schema history (the entries the catalog lacks are added)."""

    operator_id: int
    store_name: str
    new_stores: Sequence[StoreId]
    key_schema: Any
    value_schema: Any
    layout: NewLayout | None
    history: SchemaHistory


class RegistrationCalls(CatalogBase):
    """A query's start: one read to plan against, one write of what it planned."""

    def registered(self, root: str) -> Registered:
        """The schema histories, stores and current layouts below ``root`` (as
        :meth:`schema_histories`, :meth:`stores` and :meth:`layouts`), in one transaction."""
        return self._read(
            "read registration",
            lambda c, v: Registered(
                schema_history_sql.histories(c, v, root),
                inventory.store_records(c, v, root),
                layouts.current_layouts(c, v, root),
            ),
        )

    def register_query(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        operators: Sequence[OperatorRegistration],
    ) -> None:
        """Record, in one transaction, each operator store's new stores
        (:meth:`register_stores`), first layout from ``batch_id`` (:meth:`record_layout`)
        and schema history (:meth:`record_schema_history`: CommitConflict if another driver
        changed it); all or nothing, and each part finds a retry's earlier attempt done."""

        def work(connection: Connection) -> None:
            now = self.now()
            for op in operators:
                if op.new_stores:
                    inventory.register_stores(
                        connection, root, op.new_stores, op.key_schema, op.value_schema, now
                    )
                if op.layout is not None:
                    layouts.record_layout(connection, root, query_id, op.layout, batch_id, now)
                schema_history_sql.record_history(
                    connection, root, op.operator_id, op.store_name, op.history, now
                )

        self._run("register query", work, conflict)
