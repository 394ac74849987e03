"""Catalog calls of event time: each batch's watermark, and the deltas behind the change feed."""

from __future__ import annotations

from state_runtime.catalog.api.transactions import CatalogBase
from state_runtime.catalog.records import BatchWatermark, CommittedDelta
from state_runtime.catalog.sql import committed_deltas, watermarks


class EventTimeCalls(CatalogBase):
    """What the driver records per batch for its watermark, and what the change feed reads."""

    def fix_watermark(
        self, root: str, query_id: str, batch_id: int, watermark_ms: int
    ) -> BatchWatermark:
        """The watermark batch ``batch_id`` runs with: ``watermark_ms`` if the batch has none
        recorded yet, else the recorded one (a replay or restart reuses it)."""
        return self._run(
            "fix batch watermark",
            lambda c: watermarks.fix_watermark(
                c, root, query_id, batch_id, watermark_ms, self.now()
            ),
        )

    def batch_watermark(self, root: str, query_id: str, batch_id: int) -> BatchWatermark | None:
        return self._read(
            "read batch watermark",
            lambda c, v: watermarks.batch_watermark(c, v, root, query_id, batch_id),
        )

    def record_max_event_time(
        self, root: str, query_id: str, batch_id: int, max_event_ms: int | None
    ) -> None:
        """The largest event time batch ``batch_id`` saw (the next batch's watermark base)."""
        self._run(
            "record max event time",
            lambda c: watermarks.record_max_event_time(c, root, query_id, batch_id, max_event_ms),
        )

    def committed_deltas(
        self,
        root: str,
        operator_id: int,
        store_name: str,
        start_batch_id: int,
        end_batch_id: int,
        *,
        query_id: str | None = None,
    ) -> list[CommittedDelta]:
        """The delta each batch in ``[start, end]`` committed for each partition of a store,
        with the file's inventory state (a cleaned-up delta is 'deleting' or 'deleted')."""
        return self._read(
            "read committed deltas",
            lambda c, v: committed_deltas.committed_deltas(
                c, v, root, operator_id, store_name, start_batch_id, end_batch_id, query_id
            ),
        )
