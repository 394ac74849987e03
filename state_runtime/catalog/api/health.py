"""Catalog calls of health: snapshot candidates and each store's figures and status."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.pages import PAGE_STORES, PagedCalls
from state_runtime.catalog.records import (
    RecoveryCost,
    SnapshotCandidate,
    StatusChange,
    StoreHealth,
    StoreKey,
    StoreRecord,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql import health as health_queries
from state_runtime.catalog.sql.inventory import store_records_in
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.status_changes import record_statuses
from state_runtime.errors import InvalidArgument
from state_runtime.retention import RetentionPolicy


class HealthCalls(PagedCalls):
    """What health reports and the snapshot pass read."""

    def snapshot_candidates(
        self, min_deltas: int, root: str | None = None
    ) -> list[SnapshotCandidate]:
        """Stores whose committed deltas since the last snapshot number at least ``min_deltas``."""
        if min_deltas < 1:
            raise InvalidArgument(f"min_deltas must be at least 1, got {min_deltas}")
        return self._read(
            "find snapshot candidates",
            lambda c, v: health_queries.snapshot_candidates(c, v, min_deltas, Scope(root=root)),
        )

    def snapshot_candidate_pages(
        self, min_deltas: int, *, root: str | None = None, page_size: int = PAGE_STORES
    ) -> Iterator[list[tuple[StoreRecord, SnapshotCandidate, RecoveryCost]]]:
        """:meth:`snapshot_candidates`, ``page_size`` stores a page (one transaction each, in
        store id order; pages without a candidate are skipped), each with its store's record
        and recovery cost: what the snapshot pass ranks, streamed."""
        if min_deltas < 1:
            raise InvalidArgument(f"min_deltas must be at least 1, got {min_deltas}")

        def work(
            c: Connection, v: ReaderViews, scope: Scope
        ) -> list[tuple[StoreRecord, SnapshotCandidate, RecoveryCost]]:
            found = health_queries.snapshot_candidates(c, v, min_deltas, scope)
            if not found:
                return []
            costs = health_queries.recovery_costs(c, v, scope)
            records = {r.key: r for r in store_records_in(c, v, scope)}
            return [
                (records[f.key], f, costs.get(f.key, RecoveryCost(0, 0)))
                for f in found
                if f.key in records
            ]

        return self._pages("find snapshot candidates", root, work, page_size)

    def store_health(
        self, policy: RetentionPolicy, *, root: str | None = None, now: datetime | None = None
    ) -> list[StoreHealth]:
        return self._read(
            "read store health",
            lambda c, v: health_queries.store_health(
                c, v, policy, Scope(root=root), now or self.now()
            ),
        )

    def health_pages(
        self,
        policy: RetentionPolicy,
        *,
        root: str | None = None,
        now: datetime | None = None,
        page_size: int = PAGE_STORES,
    ) -> Iterator[list[tuple[StoreHealth, RecoveryCost]]]:
        """Each store's health with its recovery cost, ``page_size`` stores a page (one
        transaction each, in store id order): what a fleet-wide health pass streams."""
        at = now or self.now()
        return self._pages(
            "read store health",
            root,
            lambda c, v, scope: health_queries.health_with_costs(c, v, policy, scope, at),
            page_size,
        )

    def record_statuses(self, changes: Sequence[StatusChange]) -> dict[StoreKey, datetime]:
        """Record the status ``changes`` a health read derived, each unless a concurrent
        reader recorded it meanwhile; since when each recorded status holds. One
        transaction, none when nothing changed."""
        if not changes:
            return {}
        return self._run("record status changes", lambda c: record_statuses(c, changes, self.now()))

    def recovery_costs(self, root: str | None = None) -> dict[StoreKey, RecoveryCost]:
        """Per store (of ``root``, or all), the files and bytes a cold load of its latest
        committed version reads (one query; no storage request)."""
        return self._read(
            "estimate recovery costs",
            lambda c, v: health_queries.recovery_costs(c, v, Scope(root=root)),
        )
