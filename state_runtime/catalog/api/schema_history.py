"""Catalog calls of schema histories: what the driver checks and records before a batch, and
what readers and maintenance open stores with."""

from __future__ import annotations

from state_runtime.catalog.api.transactions import CatalogBase, conflict
from state_runtime.catalog.sql import schema_history as schema_history_sql
from state_runtime.catalog.sql.schema_history import OperatorStore
from state_runtime.store.schema_history import SchemaHistory


class SchemaHistoryCalls(CatalogBase):
    """Each operator store's schema history (see :mod:`state_runtime.store.schema_history`)."""

    def schema_histories(self, root: str) -> dict[OperatorStore, SchemaHistory]:
        """Every operator store's history below ``root``, by (operator id, store name)."""
        return self._read(
            "read schema histories", lambda c, v: schema_history_sql.histories(c, v, root)
        )

    def schema_history(self, root: str, operator_id: int, store_name: str) -> SchemaHistory | None:
        """One operator store's history, or None if the catalog knows no schema for it."""
        key = (operator_id, store_name)
        found = self._read(
            "read schema history", lambda c, v: schema_history_sql.histories(c, v, root, only=key)
        )
        return found.get(key)

    def record_schema_history(
        self, root: str, operator_id: int, store_name: str, history: SchemaHistory
    ) -> None:
        """Record the entries of ``history`` the catalog does not have yet (its recorded
        entries must be a prefix: CommitConflict if another driver changed them)."""
        self._run(
            "record schema history",
            lambda c: schema_history_sql.record_history(
                c, root, operator_id, store_name, history, self.now()
            ),
            conflict,
        )
