"""Catalog calls of cleanup: what retention keeps, what may go and why, deletions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.pages import PAGE_STORES, PagedCalls
from state_runtime.catalog.records import (
    DeletableCount,
    Deletion,
    Explanation,
    FileVerdict,
    RetainedVersion,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql import deletions, explanations, findings, lookups
from state_runtime.catalog.sql import retention as retention_sql
from state_runtime.catalog.sql.scope import Scope
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId
from state_runtime.retention import RetentionPolicy
from state_runtime.settings import MIN_RETAINED_VERSIONS


class RetentionCalls(PagedCalls):
    """The retention rule applied in SQL (see state_runtime/retention.py), and the ledger."""

    def retained_versions(
        self, root: str, store: StoreId, retain_versions: int = MIN_RETAINED_VERSIONS
    ) -> list[RetainedVersion]:
        """The store's retained versions, newest first, with the files that load each."""
        RetentionPolicy(retain_versions=retain_versions)
        return self._read(
            "read retained versions",
            lambda c, v: retention_sql.retained_versions(c, v, root, [store], retain_versions)[
                store
            ],
        )

    def retained_versions_of(
        self, root: str, stores: Sequence[StoreId], retain_versions: int = MIN_RETAINED_VERSIONS
    ) -> dict[StoreId, list[RetainedVersion]]:
        """:meth:`retained_versions` of several stores of a root, in one read."""
        RetentionPolicy(retain_versions=retain_versions)
        return self._read(
            "read retained versions",
            lambda c, v: retention_sql.retained_versions(c, v, root, stores, retain_versions),
        )

    def deletable_files(
        self,
        policy: RetentionPolicy,
        *,
        root: str | None = None,
        store: StoreId | None = None,
        now: datetime | None = None,
        limit: int | None = None,
    ) -> list[FileVerdict]:
        """What cleanup under ``policy`` would delete now, each with its reason (a dry run);
        at most ``limit`` files, oldest versions first."""
        if store is not None and root is None:
            raise InvalidArgument("a store is identified within a root: pass root too")

        def work(connection: Connection, views: ReaderViews) -> list[FileVerdict]:
            scope = Scope(root=root)
            if store is not None and root is not None:
                found = lookups.store_ids(connection, views, root, [store])
                if store not in found:
                    return []
                scope = Scope(store_ids=(found[store],), dialect=connection.dialect.name)
            rows = retention_sql.verdict_rows(
                connection,
                views,
                policy,
                scope,
                now or self.now(),
                only_deletable=True,
                limit=limit,
            )
            return [verdict for _, verdict in rows]

        return self._read("find deletable files", work)

    def deletable_counts(
        self,
        policy: RetentionPolicy,
        *,
        root: str | None = None,
        now: datetime | None = None,
        page_size: int = PAGE_STORES,
    ) -> Iterator[list[DeletableCount]]:
        """What cleanup would delete now, counted per store and verdict in SQL, ``page_size``
        stores a page (as :meth:`deletable_pages`): the plan's figures, whatever a store's
        backlog, in a few rows per store."""
        at = now or self.now()
        return self._pages(
            "count deletable files",
            root,
            lambda c, v, scope: deletions.deletable_counts(c, v, policy, scope, at),
            page_size,
        )

    def deletable_pages(
        self,
        policy: RetentionPolicy,
        *,
        root: str | None = None,
        now: datetime | None = None,
        page_size: int = PAGE_STORES,
    ) -> Iterator[list[FileVerdict]]:
        """:meth:`deletable_files`, ``page_size`` stores a page (one transaction each, in
        store id order; pages with nothing deletable are skipped): the cleanup plan streamed."""
        at = now or self.now()
        return self._pages(
            "find deletable files",
            root,
            lambda c, v, scope: retention_sql.file_verdicts(
                c, v, policy, scope, at, only_deletable=True
            ),
            page_size,
        )

    def file_verdicts(
        self, policy: RetentionPolicy, *, root: str | None = None, now: datetime | None = None
    ) -> list[FileVerdict]:
        """The verdict on every live or claimed file: needed, kept, or deletable, and why."""
        return self._read(
            "judge files",
            lambda c, v: retention_sql.file_verdicts(
                c, v, policy, Scope(root=root), now or self.now()
            ),
        )

    def unconfirmed_snapshots(
        self, policy: RetentionPolicy, *, root: str | None, now: datetime | None = None
    ) -> list[FileVerdict]:
        """The verdicts on ``root``'s (None: every root's) committed snapshots not verified
        yet (never checked, or failed): what validation verifies first. Cheap when there are
        none."""
        return self._read(
            "judge unverified snapshots",
            lambda c, v: findings.unconfirmed_snapshot_verdicts(
                c, v, policy, root, now or self.now()
            ),
        )

    def explain(
        self,
        root: str,
        path: str,
        policy: RetentionPolicy,
        *,
        now: datetime | None = None,
        absent: bool = False,
    ) -> Explanation:
        """Why the file at ``path`` (relative to ``root``) is kept, or why it may be deleted.
        A damaged file, or one the caller found ``absent`` from storage, is never "needed":
        the answer says what is lost and what still loads."""
        return self._read(
            "explain file",
            lambda c, v: explanations.explain(
                c, v, root, path, policy, now or self.now(), absent=absent
            ),
        )

    def claim_deletions(
        self,
        run_id: int,
        policy: RetentionPolicy,
        root: str,
        only_stores: Sequence[StoreId] | None = None,
        *,
        limit: int | None = None,
        now: datetime | None = None,
        from_version: int | None = None,
    ) -> list[FileVerdict]:
        """Mark the deletable files of ``root`` (or of the given stores) as being deleted by
        ``run_id`` and return them: first at most ``limit`` files another run had claimed and
        not recorded (verdict ``deleting``), then at most ``limit`` new ones (oldest versions
        first, none below ``from_version``). A file this run claimed is never returned to it
        again (one storage refused waits for the next run). Delete them from storage, then
        call ``record_deletions``; claim again until both parts come back with fewer than
        ``limit``, each claim ``from_version`` the newest version of the new files the one
        before took (a keyset: no claim reads again what the ones before it read)."""
        if limit is not None and limit < 1:
            raise InvalidArgument(f"limit must be at least 1, got {limit}")
        return self._run(
            "claim deletions",
            lambda c: deletions.claim_deletions(
                c, run_id, policy, root, only_stores, now or self.now(), limit, from_version
            ),
        )

    def record_deletions(self, run_id: int, root: str, paths: Sequence[str]) -> int:
        """Record claimed files as deleted from storage, each with its reason, in the ledger."""
        return self._run(
            "record deletions",
            lambda c: deletions.record_deletions(c, run_id, root, paths, self.now()),
        )

    def record_deletions_by_id(self, run_id: int, root: str, file_ids: Sequence[int]) -> int:
        """``record_deletions`` of claimed files named by their ids (``FileVerdict.file_id``,
        set by ``claim_deletions``): what cleanup records, without looking paths up again."""
        return self._run(
            "record deletions",
            lambda c: deletions.record_deletions_by_id(c, run_id, root, file_ids, self.now()),
        )

    def record_lost(self, run_id: int, root: str, paths: Sequence[str], reason: str) -> int:
        """Record files validation found missing or corrupt as gone (ledger: ``lost: reason``),
        so that retention stops counting on them and keeps what loads their versions instead."""
        return self._run(
            "record lost files",
            lambda c: deletions.record_lost(c, run_id, root, paths, reason, self.now()),
        )

    def deletion_history(
        self, *, root: str | None = None, since: datetime | None = None, limit: int = 1000
    ) -> list[Deletion]:
        return self._read(
            "read deletion history",
            lambda c, v: deletions.deletion_history(c, v, root, since, limit),
        )
