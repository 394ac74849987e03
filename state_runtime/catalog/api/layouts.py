"""Catalog calls of operator layouts: what the runtime records and checks when a query starts,
and the switch a repartition commits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from state_runtime.catalog.api.transactions import CatalogBase, conflict
from state_runtime.catalog.records import Layout, NewLayout
from state_runtime.catalog.sql import layouts
from state_runtime.catalog.sql.layouts import Switch
from state_runtime.catalog.sql.schema_history import OperatorStore
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo


class LayoutCalls(CatalogBase):
    """Each operator's partition layout (see :mod:`state_runtime.catalog.sql.layouts`)."""

    def layouts(self, root: str) -> dict[OperatorStore, Layout]:
        """Each operator's current layout below ``root``, by (operator id, store name)."""
        return self._read("read layouts", lambda c, v: layouts.current_layouts(c, v, root))

    def layout_history(self, root: str) -> list[Layout]:
        """Every layout recorded below ``root`` (repartitions included), oldest first."""
        return self._read("read layout history", lambda c, v: layouts.layout_history(c, v, root))

    def record_layout(self, root: str, query_id: str, layout: NewLayout, from_batch: int) -> None:
        """Record an operator's first layout (a no-op when it has one)."""
        self._run(
            "record layout",
            lambda c: layouts.record_layout(c, root, query_id, layout, from_batch, self.now()),
            conflict,
        )

    def switch_layout(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        expected: Mapping[StoreId, CheckpointRef],
        snapshots: Sequence[CheckpointInfo],
        new: Sequence[NewLayout],
        *,
        reason: str,
        run_id: int | None,
    ) -> Switch:
        """Switch the operators of ``new`` to their new layouts, in one transaction."""
        return self._run(
            "switch layout",
            lambda c: layouts.switch_layout(
                c, root, query_id, batch_id, expected, snapshots, new, reason, run_id, self.now()
            ),
            conflict,
        )
