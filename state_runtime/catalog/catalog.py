"""The catalog's public face: one object per database, one retried transaction per call."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from state_runtime.catalog import (
    changes,
    commits,
    health,
    inventory,
    metrics,
    retention,
    runs,
    schema,
    verification,
    watermarks,
)
from state_runtime.catalog.engine import (
    RetryPolicy,
    create_catalog_engine,
    display_url,
    run_transaction,
)
from state_runtime.catalog.records import (
    BatchCommit,
    BatchMetrics,
    BatchWatermark,
    CommitEntry,
    CommittedDelta,
    Deletion,
    Explanation,
    FileRecord,
    FileVerdict,
    FoundProblem,
    Lease,
    MaintenanceRun,
    RecordedBatchMetrics,
    Repair,
    RetainedVersion,
    SnapshotCandidate,
    StoreHealth,
    StoreKey,
    StoreProblem,
    StoreRecord,
)
from state_runtime.catalog.retention import Scope
from state_runtime.catalog.settings import CatalogTimeouts, catalog_url
from state_runtime.catalog.tables import checkpoint_files, stores
from state_runtime.checkpoint import CheckpointInfo
from state_runtime.errors import CommitConflict, InvalidArgument, MaintenanceRefused
from state_runtime.identity import EMPTY, CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.retention import RetentionPolicy
from state_runtime.settings import MIN_RETAINED_VERSIONS

T = TypeVar("T")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _conflict(exc: DBAPIError) -> Exception | None:
    """A unique or foreign-key violation during a commit means a concurrent writer won."""
    if isinstance(exc, IntegrityError):
        return CommitConflict(f"the catalog refused the commit: {str(exc.orig).splitlines()[0]}")
    return None


class Catalog:
    """The SQL catalog of stores, checkpoint files, commits and maintenance.

    Open it with ``Catalog.open()`` (URL from ``STATE_CATALOG_URL``, else the embedded SQLite
    file). Every method is one transaction: it happens entirely or not at all, transient
    database errors are retried under ``retry``, and each attempt is bounded by the engine's
    CatalogTimeouts. Every method is safe to call again after CatalogUnavailable (its
    ``retryable`` is true): a retry finds what an attempt whose answer was lost did.
    Timestamps are aware UTC datetimes; ``now`` arguments exist so that tests and dry runs can
    ask "as of" a time.
    """

    def __init__(self, engine: Engine, *, retry: RetryPolicy | None = None) -> None:
        self.engine = engine
        self.retry = retry or RetryPolicy()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        upgrade: bool = False,
        retry: RetryPolicy | None = None,
        timeouts: CatalogTimeouts | None = None,
    ) -> Catalog:
        """Connect to the catalog at ``url`` (default: ``catalog_url()``) and check its schema.

        With ``upgrade`` the schema is first migrated to the head revision (what the embedded
        demo wants; a SQLite file and its folder are created); otherwise nothing is created,
        and a missing SQLite file or an older schema raises CatalogSchemaOutdated naming the
        command that upgrades it. A schema newer than this code raises CatalogSchemaTooNew;
        a malformed URL InvalidCatalogUrl; an unreachable database CatalogUnavailable.
        ``timeouts`` default to ``CatalogTimeouts.from_env()``.
        """
        engine = create_catalog_engine(url or catalog_url(), timeouts)
        policy = retry or RetryPolicy()
        try:
            if upgrade:
                schema.upgrade(engine, retry=policy)
            schema.check_schema(engine, retry=policy)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, retry=policy)

    @property
    def url(self) -> str:
        """The database URL with the password masked."""
        return display_url(self.engine.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(
        self,
        what: str,
        work: Callable[[Connection], T],
        translate: Callable[[DBAPIError], Exception | None] | None = None,
    ) -> T:
        return run_transaction(self.engine, work, retry=self.retry, what=what, translate=translate)

    # --- stores -------------------------------------------------------------------------

    def register_store(
        self, root: str, store: StoreId, key_schema: Any = None, value_schema: Any = None
    ) -> None:
        """Record a store and its key and value schemas (JSON-able: a DDL string or a dict)."""
        inventory.validate_root(root)

        def work(connection: Connection) -> None:
            now = _utcnow()
            inventory.ensure_stores(connection, root, [store], now)
            connection.execute(
                stores.update()
                .where(
                    stores.c.checkpoint_root == root,
                    stores.c.operator_id == store.operator_id,
                    stores.c.partition_id == store.partition_id,
                    stores.c.store_name == store.store_name,
                )
                .values(key_schema=key_schema, value_schema=value_schema)
            )

        self._run("register store", work)

    def roots(self) -> list[str]:
        """Every checkpoint root below which the catalog knows a store."""
        return self._run(
            "list roots",
            lambda c: sorted(c.execute(sa.select(stores.c.checkpoint_root).distinct()).scalars()),
        )

    def stores(self, root: str | None = None) -> list[StoreRecord]:
        """Every store the catalog knows (below ``root``, if given)."""

        def work(connection: Connection) -> list[StoreRecord]:
            s = stores.c
            query = stores.select().order_by(
                s.checkpoint_root, s.operator_id, s.partition_id, s.store_name
            )
            if root is not None:
                query = query.where(s.checkpoint_root == root)
            return [
                StoreRecord(
                    key=StoreKey(
                        r.checkpoint_root, StoreId(r.operator_id, r.partition_id, r.store_name)
                    ),
                    key_schema=r.key_schema,
                    value_schema=r.value_schema,
                    created_at=r.created_at,
                    latest=CheckpointRef(r.latest_version, r.latest_checkpoint_id)
                    if r.latest_version
                    else EMPTY,
                    last_committed_at=r.last_committed_at,
                )
                for r in connection.execute(query)
            ]

        return self._run("list stores", work)

    # --- the commit protocol ------------------------------------------------------------

    def record_files(
        self, root: str, infos: Sequence[CheckpointInfo], *, run_id: int | None = None
    ) -> None:
        """Record checkpoint files as written (idempotent). Tasks call it right after writing a
        delta; maintenance after writing a snapshot (with its ``run_id``); the reconciliation
        sweep for files it found. A file's state follows the commit log."""

        def work(connection: Connection) -> None:
            inventory.record_files(connection, root, infos, _utcnow(), run_id=run_id)

        self._run("record files", work, _conflict)

    def record_snapshot(
        self,
        root: str,
        info: CheckpointInfo,
        *,
        run_id: int | None = None,
        verified: bool = False,
        problem: str | None = None,
    ) -> str | None:
        """Record a snapshot written by maintenance, in one transaction with what verifying
        its bytes after the write found: ``verified`` (it may now supersede deltas), or the
        ``problem`` (it supersedes nothing and the store gets an open problem). Without
        either it is recorded unverified.

        A snapshot already recorded with another size or checksum (the file changed since)
        keeps its record and is recorded as damaged. Returns the problem recorded, if any.
        """
        if info.kind is not FileKind.SNAPSHOT:
            raise InvalidArgument(f"record_snapshot got a {info.kind.value} file", path=info.path)

        def work(connection: Connection) -> str | None:
            now = _utcnow()
            found = problem
            f = checkpoint_files.c
            recorded = inventory.files_at(connection, root, [info.path], f.checksum, f.size_bytes)
            if recorded and (recorded[0].checksum, recorded[0].size_bytes) != (
                info.checksum,
                info.bytes_written,
            ):
                found = found or (
                    f"the file ({info.bytes_written} bytes) differs from its record "
                    f"({recorded[0].size_bytes} bytes, another checksum)"
                )
            else:
                inventory.record_files(connection, root, [info], now, run_id=run_id)
            if verified or found is not None:
                verification.record_verifications(connection, root, {info.path: found}, now)
            if found is not None:
                opened = [FoundProblem(found, info.path, info.version)]
                verification.add_problems(connection, root, info.store, opened, run_id, now)
            return found

        return self._run("record snapshot", work, _conflict)

    def commit_batch(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        infos: Sequence[CheckpointInfo],
        *,
        replace: bool = True,
    ) -> BatchCommit:
        """Commit a micro-batch: every store's new checkpoint, in one transaction.

        Re-committing a batch (a replay) replaces its entries and orphans the files they named;
        with ``replace=False`` it raises CommitConflict instead. Two drivers committing the same
        batch at once are serialized by the store locks: the later commit replaces the earlier
        one whole (or, without ``replace``, fails), so the batch is never half one and half the
        other. See ``commits.commit_batch`` for the checks that raise CommitConflict.
        """

        def work(connection: Connection) -> BatchCommit:
            return commits.commit_batch(
                connection, root, query_id, batch_id, infos, _utcnow(), replace=replace
            )

        return self._run("commit batch", work, _conflict)

    def committed_ids(
        self, root: str, query_id: str, batch_id: int
    ) -> dict[StoreId, CheckpointRef]:
        """The checkpoint each store committed in batch ``batch_id``; {} if it is not committed.
        The driver of batch ``b`` ships ``committed_ids(root, query, b - 1)`` to its tasks."""
        return self._run(
            "read committed ids",
            lambda c: commits.committed_ids(c, root, query_id, batch_id),
        )

    def latest_committed(self, root: str) -> dict[StoreId, CheckpointRef]:
        """Each store's latest committed (version, checkpoint id) below ``root``."""
        return self._run("read latest versions", lambda c: commits.latest_committed(c, root))

    def commit_history(
        self,
        root: str,
        *,
        query_id: str | None = None,
        store: StoreId | None = None,
        limit: int = 100,
    ) -> list[CommitEntry]:
        return self._run(
            "read commit history",
            lambda c: commits.commit_history(c, root, query_id=query_id, store=store, limit=limit),
        )

    # --- runtime metrics ----------------------------------------------------------------

    def record_batch_metrics(
        self, root: str, query_id: str, batch_id: int, figures: BatchMetrics
    ) -> None:
        self._run(
            "record batch metrics",
            lambda c: metrics.record_batch_metrics(c, root, query_id, batch_id, figures, _utcnow()),
        )

    def batch_metrics(
        self, root: str, query_id: str, *, limit: int = 100
    ) -> list[RecordedBatchMetrics]:
        return self._run(
            "read batch metrics",
            lambda c: metrics.batch_metrics_history(c, root, query_id, limit),
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
        return self._run(
            "read committed deltas",
            lambda c: changes.committed_deltas(
                c, root, operator_id, store_name, start_batch_id, end_batch_id, query_id
            ),
        )

    # --- event time ---------------------------------------------------------------------

    def fix_watermark(
        self, root: str, query_id: str, batch_id: int, watermark_ms: int
    ) -> BatchWatermark:
        """The watermark batch ``batch_id`` runs with: ``watermark_ms`` if the batch has none
        recorded yet, else the recorded one (a replay or restart reuses it)."""
        return self._run(
            "fix batch watermark",
            lambda c: watermarks.fix_watermark(
                c, root, query_id, batch_id, watermark_ms, _utcnow()
            ),
        )

    def batch_watermark(self, root: str, query_id: str, batch_id: int) -> BatchWatermark | None:
        return self._run(
            "read batch watermark",
            lambda c: watermarks.batch_watermark(c, root, query_id, batch_id),
        )

    def record_max_event_time(
        self, root: str, query_id: str, batch_id: int, max_event_ms: int | None
    ) -> None:
        """The largest event time batch ``batch_id`` saw (the next batch's watermark base)."""
        self._run(
            "record max event time",
            lambda c: watermarks.record_max_event_time(c, root, query_id, batch_id, max_event_ms),
        )

    # --- maintenance questions ----------------------------------------------------------

    def snapshot_candidates(
        self, min_deltas: int, root: str | None = None
    ) -> list[SnapshotCandidate]:
        """Stores whose committed deltas since the last snapshot number at least ``min_deltas``."""
        if min_deltas < 1:
            raise InvalidArgument(f"min_deltas must be at least 1, got {min_deltas}")
        return self._run(
            "find snapshot candidates",
            lambda c: health.snapshot_candidates(c, min_deltas, root),
        )

    def retained_versions(
        self, root: str, store: StoreId, retain_versions: int = MIN_RETAINED_VERSIONS
    ) -> list[RetainedVersion]:
        """The store's retained versions, newest first, with the files that load each."""
        RetentionPolicy(retain_versions=retain_versions)
        return self._run(
            "read retained versions",
            lambda c: retention.retained_versions(c, root, store, retain_versions),
        )

    def deletable_files(
        self,
        policy: RetentionPolicy,
        *,
        root: str | None = None,
        store: StoreId | None = None,
        now: datetime | None = None,
    ) -> list[FileVerdict]:
        """What cleanup under ``policy`` would delete now, each with its reason (a dry run)."""
        if store is not None and root is None:
            raise InvalidArgument("a store is identified within a root: pass root too")

        def work(connection: Connection) -> list[FileVerdict]:
            scope = Scope(root=root)
            if store is not None and root is not None:
                found = inventory.store_ids(connection, root, [store])
                if store not in found:
                    return []
                scope = Scope(store_ids=(found[store],))
            return retention.file_verdicts(
                connection, policy, scope, now or _utcnow(), only_deletable=True
            )

        return self._run("find deletable files", work)

    def file_verdicts(
        self, policy: RetentionPolicy, *, root: str | None = None, now: datetime | None = None
    ) -> list[FileVerdict]:
        """The verdict on every live or claimed file: needed, kept, or deletable, and why."""
        return self._run(
            "judge files",
            lambda c: retention.file_verdicts(c, policy, Scope(root=root), now or _utcnow()),
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
        return self._run(
            "explain file",
            lambda c: retention.explain(c, root, path, policy, now or _utcnow(), absent=absent),
        )

    def store_files(self, root: str, store: StoreId) -> list[FileRecord]:
        """The live files of one store, oldest versions first (with their verification)."""

        def work(connection: Connection) -> list[FileRecord]:
            found = inventory.store_ids(connection, root, [store])
            return [] if store not in found else retention.live_files(connection, found[store])

        return self._run("read store files", work)

    # --- verification, problems, repairs ------------------------------------------------

    def record_verifications(self, root: str, results: Mapping[str, str | None]) -> None:
        """Record what verifying files found: None (intact) or the problem, per path."""
        self._run(
            "record verifications",
            lambda c: verification.record_verifications(c, root, results, _utcnow()),
        )

    def record_validation(
        self,
        run_id: int | None,
        key: StoreKey,
        checked: Mapping[str, str | None],
        found: Sequence[FoundProblem],
        *,
        started_at: datetime | None = None,
    ) -> None:
        """Record one store's validation by ``run_id``, which started at ``started_at``: each
        checked file's verification; the store's open problems become ``found`` (problems
        recorded after the validation started are left for the next one)."""
        self._run(
            "record validation",
            lambda c: verification.record_validation(
                c, key.root, key.store, checked, found, run_id, _utcnow(), started_at
            ),
        )

    def add_problems(
        self, key: StoreKey, found: Sequence[FoundProblem], *, run_id: int | None = None
    ) -> int:
        """Open problems on a store (those already open are kept as they are)."""
        return self._run(
            "record problems",
            lambda c: verification.add_problems(c, key.root, key.store, found, run_id, _utcnow()),
        )

    def problems(
        self,
        *,
        root: str | None = None,
        store: StoreKey | None = None,
        only_open: bool = True,
    ) -> list[StoreProblem]:
        """Store problems, oldest first: open ones (what holds stores back), or all."""
        if store is not None:
            root = store.root
        return self._run(
            "read problems",
            lambda c: verification.problems(
                c, root, None if store is None else store.store, only_open=only_open
            ),
        )

    def resolve_problems(
        self,
        key: StoreKey,
        resolution: str,
        *,
        run_id: int | None = None,
        path: str | None = None,
    ) -> int:
        """Resolve a store's open problems (an operator's decision, with why); the store is
        cleaned again. Returns how many were open."""
        return self._run(
            "resolve problems",
            lambda c: verification.resolve_problems(
                c, key.root, key.store, resolution, run_id, _utcnow(), path=path
            ),
        )

    def begin_repair(
        self, run_id: int, root: str, path: str, problem: str, damaged: bytes | None
    ) -> int:
        """Record a damaged snapshot (as found; None if gone) before it is replaced."""
        return self._run(
            "record repair",
            lambda c: verification.begin_repair(c, run_id, root, path, problem, damaged, _utcnow()),
        )

    def repair_removed(self, repair_id: int) -> None:
        self._run(
            "record repair step",
            lambda c: verification.repair_removed(c, repair_id, _utcnow()),
        )

    def finish_repair(self, repair_id: int, root: str, info: CheckpointInfo) -> None:
        """The rebuilt snapshot ``info`` is written and verified: it replaces the record."""
        self._run(
            "finish repair",
            lambda c: verification.finish_repair(c, repair_id, root, info, _utcnow()),
        )

    def repairs(self, root: str | None = None) -> list[Repair]:
        return self._run("read repairs", lambda c: verification.repairs(c, root))

    def store_health(
        self, policy: RetentionPolicy, *, root: str | None = None, now: datetime | None = None
    ) -> list[StoreHealth]:
        return self._run(
            "read store health",
            lambda c: health.store_health(c, policy, root, now or _utcnow()),
        )

    # --- maintenance runs, leases, deletions --------------------------------------------

    def start_run(self, kind: str, owner: str, parameters: dict[str, Any] | None = None) -> int:
        """Record a maintenance run ('snapshot', 'cleanup', 'validate', 'reconcile') with this
        host and process; its token, generated here, makes a retried call find its run."""
        token = new_checkpoint_id()
        return self._run(
            "start maintenance run",
            lambda c: runs.start_run(c, kind, owner, dict(parameters or {}), token, _utcnow()),
        )

    def finish_run(
        self,
        run_id: int,
        outcome: str,
        counts: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Close a run as 'succeeded' or 'failed' with its counts (already closed that way:
        nothing to do)."""
        self._run(
            "finish maintenance run",
            lambda c: runs.finish_run(c, run_id, outcome, dict(counts or {}), error, _utcnow()),
        )

    def heartbeat(self, run_id: int) -> bool:
        """Show that a running run is alive; False if it is no longer running."""
        return self._run("run heartbeat", lambda c: runs.heartbeat(c, run_id, _utcnow()))

    def close_abandoned_runs(self, *, now: datetime | None = None) -> list[MaintenanceRun]:
        """Close as 'abandoned' the runs left running by a process that died (see
        ``catalog.runs``); return them."""
        return self._run(
            "close abandoned runs", lambda c: runs.close_abandoned_runs(c, now or _utcnow())
        )

    def run(self, run_id: int) -> MaintenanceRun | None:
        return self._run("read maintenance run", lambda c: runs.get_run(c, run_id))

    def recent_runs(self, limit: int = 50) -> list[MaintenanceRun]:
        return self._run("read maintenance runs", lambda c: runs.recent_runs(c, limit))

    def try_acquire_lease(
        self, key: StoreKey, owner: str, ttl: timedelta, *, run_id: int | None = None
    ) -> Lease | None:
        """Take the store's maintenance lease, or None if another holder has it."""
        token = new_checkpoint_id()
        return self._run(
            "acquire lease",
            lambda c: runs.try_acquire_lease(c, key, owner, ttl, run_id, token, _utcnow()),
        )

    def renew_lease(self, lease: Lease, ttl: timedelta) -> Lease:
        return self._run(
            "renew lease",
            lambda c: runs.renew_lease(c, runs.known_store_id(c, lease.key), lease, ttl, _utcnow()),
        )

    def release_lease(self, lease: Lease) -> bool:
        return self._run(
            "release lease",
            lambda c: runs.release_lease(c, runs.known_store_id(c, lease.key), lease),
        )

    @contextlib.contextmanager
    def store_lease(
        self, key: StoreKey, owner: str, ttl: timedelta, *, run_id: int | None = None
    ) -> Iterator[Lease]:
        """Hold the store's maintenance lease for a block; MaintenanceRefused if it is taken."""
        lease = self.try_acquire_lease(key, owner, ttl, run_id=run_id)
        if lease is None:
            holder = self._run(
                "read lease",
                lambda c: runs.lease_holder(c, runs.known_store_id(c, key)),
            )
            who = "another run" if holder is None else f"{holder.owner} (run {holder.run_id})"
            until = "" if holder is None else f" until {holder.expires_at.isoformat()}"
            raise MaintenanceRefused(
                f"store {key} is being maintained by {who}{until}", store=key.store
            )
        try:
            yield lease
        finally:
            self.release_lease(lease)

    def claim_deletions(
        self,
        run_id: int,
        policy: RetentionPolicy,
        root: str,
        only_stores: Sequence[StoreId] | None = None,
        *,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> list[FileVerdict]:
        """Mark the deletable files of ``root`` (or of the given stores) as being deleted by
        ``run_id`` and return them, at most ``limit`` new ones (oldest versions first); files
        an interrupted run had claimed come back too. Delete them from storage, then call
        ``record_deletions``."""
        if limit is not None and limit < 1:
            raise InvalidArgument(f"limit must be at least 1, got {limit}")
        return self._run(
            "claim deletions",
            lambda c: retention.claim_deletions(
                c, run_id, policy, root, only_stores, now or _utcnow(), limit
            ),
        )

    def record_deletions(self, run_id: int, root: str, paths: Sequence[str]) -> int:
        """Record claimed files as deleted from storage, each with its reason, in the ledger."""
        return self._run(
            "record deletions",
            lambda c: retention.record_deletions(c, run_id, root, paths, _utcnow()),
        )

    def record_lost(self, run_id: int, root: str, paths: Sequence[str], reason: str) -> int:
        """Record files validation found missing or corrupt as gone (ledger: ``lost: reason``),
        so that retention stops counting on them and keeps what loads their versions instead."""
        return self._run(
            "record lost files",
            lambda c: retention.record_lost(c, run_id, root, paths, reason, _utcnow()),
        )

    def deletion_history(
        self, *, root: str | None = None, since: datetime | None = None, limit: int = 1000
    ) -> list[Deletion]:
        return self._run(
            "read deletion history",
            lambda c: retention.deletion_history(c, root, since, limit),
        )
