"""Catalog calls of the operators' history: committed versions and what became of their files."""

from __future__ import annotations

from collections.abc import Sequence

from state_runtime.catalog.api.transactions import CatalogBase
from state_runtime.catalog.records import (
    NamesMark,
    Position,
    RecordedBatchMetrics,
    Unsettled,
    VersionHistory,
)
from state_runtime.catalog.sql import batch_metrics, history, positions
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId


class HistoryCalls(CatalogBase):
    """What ``statestore history`` asks, like Delta's DESCRIBE HISTORY."""

    def version_history(
        self,
        root: str,
        *,
        stores: Sequence[StoreId] | None = None,
        query_id: str | None = None,
        limit: int = 100,
    ) -> list[VersionHistory]:
        """The ``limit`` newest committed versions below ``root`` (of ``stores``, of the query
        ``query_id``), newest first, each with its batch, rows, and the files of its
        checkpoint id (delta, snapshots) with their deletions."""
        if limit < 1:
            raise InvalidArgument(f"limit must be at least 1, got {limit}")
        return self._read(
            "read version history",
            lambda c, v: history.version_history(c, v, root, stores, query_id, limit),
        )

    def query_ids(self, root: str) -> list[str]:
        """The queries that committed below ``root``."""
        return self._read("list queries", lambda c, v: history.query_ids(c, v, root))

    def root_queries(self) -> dict[str, list[str]]:
        """Every root the catalog knows, with the queries that ever committed below it (the
        pairs of ``root_queries``: one read, whatever the number of roots)."""
        return self._read("list queries by root", history.root_queries)

    def names_mark(self) -> NamesMark:
        """What the stores' names depend on, compared between reads (``StoreNames.current``):
        the stores' count and newest id, the roots, the (root, query) pairs' count and
        newest id, each read by its index or a table of one row a pair, in milliseconds."""
        return self._read("read what names follow", history.names_mark)

    def batch_metrics_after(
        self, after: Position, *, limit: int = 200
    ) -> list[tuple[Position, RecordedBatchMetrics]]:
        """Batch metrics recorded after ``after`` (every root and query), in the order they
        became visible, with their positions: what a reader such as Dagster's sensor has not
        seen yet, each exactly once (``sql/positions.py``: only once their transactions
        ended)."""
        return self._read(
            "read batch metrics", lambda c, v: batch_metrics.metrics_after(c, v, after, limit)
        )

    def unsettled(self, metrics_after: Position, runs_after: Position) -> Unsettled:
        """The batch metrics after ``metrics_after`` and runs after ``runs_after`` that
        :meth:`batch_metrics_after` and ``runs_after`` do not return yet (an older writing
        transaction of the server is still open), and how long the oldest one has been open:
        why a reader that found nothing waits."""
        return self._read(
            "read unsettled rows",
            lambda c, v: positions.unsettled(
                c,
                [
                    (v.batch_metrics.c.xact_id, v.batch_metrics.c.metrics_id, metrics_after),
                    (v.runs.c.xact_id, v.runs.c.run_id, runs_after),
                ],
            ),
        )
