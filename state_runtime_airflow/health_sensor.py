"""A sensor that waits until the stores in scope are healthy (none broken, and none degraded
unless allowed), logging each store that is not, e.g. before a query is restarted after a
repair or a restore."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context

from state_runtime.maintenance import MaintenancePolicy, StoreStatus, parse_store_key, store_reports
from state_runtime_airflow.hooks import DEFAULT_CATALOG_CONN, DEFAULT_STORAGE_CONN, StateCatalogHook
from state_runtime_airflow.operators import owner_of


class StateStoresHealthySensor(BaseSensorOperator):
    """Waits until no store in scope (``checkpoint_roots``, or ``stores``) is broken (nor degraded,
    unless ``allow_degraded``); each poke reads the catalog only."""

    template_fields: Sequence[str] = ("checkpoint_roots", "stores")

    def __init__(
        self,
        *,
        checkpoint_roots: Sequence[str] | None = None,
        stores: Sequence[str] | None = None,
        allow_degraded: bool = True,
        policy: Mapping[str, object] | None = None,
        state_catalog_conn_id: str = DEFAULT_CATALOG_CONN,
        storage_conn_id: str | None = DEFAULT_STORAGE_CONN,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_roots = checkpoint_roots
        self.stores = stores
        self.allow_degraded = allow_degraded
        self.policy = policy
        self.hook = StateCatalogHook(state_catalog_conn_id, storage_conn_id)

    def poke(self, context: Context) -> bool:
        policy = MaintenancePolicy.from_env().with_settings(
            dict(self.policy or {}), f"task {self.task_id} policy"
        )
        only = [parse_store_key(s) for s in self.stores] if self.stores else None
        with self.hook.fleet(owner_of(context), self.checkpoint_roots) as fleet:
            reports = store_reports(fleet, policy, only=only)
        bad = {StoreStatus.BROKEN} | (set() if self.allow_degraded else {StoreStatus.DEGRADED})
        waiting = [r for r in reports if r.status.status in bad]
        for report in waiting:
            self.log.info("waiting for %s: %s", report.key, report.status)
        return not waiting
