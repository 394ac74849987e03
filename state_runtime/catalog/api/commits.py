"""Catalog calls of the streaming runtime: stores, files written, batch commits, batch metrics."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace as with_fields
from typing import Any

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.transactions import CatalogBase, conflict
from state_runtime.catalog.records import (
    BatchCommit,
    BatchMetrics,
    BatchStart,
    CommitEntry,
    RecordedBatchMetrics,
    Suspects,
)
from state_runtime.catalog.sql import (
    batch_intents,
    batch_metrics,
    commits,
    inventory,
    rewind,
    roots,
)
from state_runtime.catalog.sql import holders as holders_sql
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo


class CommitCalls(CatalogBase):
    """What the driver and the tasks record and read: the commit protocol."""

    def register_store(
        self, root: str, store: StoreId, key_schema: Any = None, value_schema: Any = None
    ) -> None:
        """Record a store and its key and value schemas (JSON-able: a DDL string or a dict)."""
        roots.validate_root(root)

        def work(connection: Connection) -> None:
            inventory.register_stores(
                connection, root, [store], key_schema, value_schema, self.now()
            )

        self._run("register store", work)

    def register_stores(
        self, root: str, wanted: Sequence[StoreId], key_schema: Any = None, value_schema: Any = None
    ) -> None:
        """Record stores that share their key and value schemas (an operator's partitions)."""
        roots.validate_root(root)

        def work(connection: Connection) -> None:
            now = self.now()
            inventory.register_stores(connection, root, wanted, key_schema, value_schema, now)

        self._run("register stores", work)

    def begin_batch(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        run: str,
        operators: Sequence[tuple[int, str, int]],
    ) -> BatchStart:
        """Record the intent of ``run`` to run batch ``batch_id`` (its operators as (operator
        id, store name, state partitions)) before any task runs, and read what the batch starts
        from: the query's last committed batch and batch ``batch_id - 1``'s checkpoints. One
        transaction; see :mod:`state_runtime.catalog.sql.batch_intents`."""
        return self._run(
            "begin batch",
            lambda c: batch_intents.begin_batch(
                c, root, query_id, batch_id, run, operators, self.now()
            ),
        )

    def record_files(
        self, root: str, infos: Sequence[CheckpointInfo], *, run_id: int | None = None
    ) -> None:
        """Record checkpoint files as written (idempotent). Tasks call it right after writing a
        delta; maintenance after writing a snapshot (with its ``run_id``); the reconciliation
        sweep for files it found. A file's state follows the commit log."""

        def work(connection: Connection) -> None:
            inventory.record_files(connection, root, infos, self.now(), run_id=run_id)

        self._run("record files", work, conflict)

    def commit_batch(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        infos: Sequence[CheckpointInfo],
        *,
        replace: bool = True,
        run: str | None = None,
        duplicates: Sequence[CheckpointInfo] = (),
        holders: Mapping[StoreId, str] | None = None,
        suspects: Suspects = (),
        metrics: BatchMetrics | None = None,
    ) -> BatchCommit:
        """Commit a micro-batch from its task reports, in one transaction: every store's new
        checkpoint file (recorded here: tasks record nothing), the ``duplicates`` the driver
        saw (recorded, orphaned), each store's holder (the worker that wrote its checkpoint),
        the settled intent of ``run`` with its ``suspects``, and the batch's ``metrics``
        (their ``commit_ms``: the commit's work in this transaction).

        Re-committing a batch (a replay) replaces its entries and orphans the files they named,
        and resolves the open problems about those files (a loss the batch after recorded):
        no committed version reads them any more. With ``replace=False`` it raises
        CommitConflict instead. Two drivers committing the same
        batch at once are serialized by the store locks: the later commit replaces the earlier
        one whole (or, without ``replace``, fails), so the batch is never half one and half the
        other; but a commit whose ``run`` began before another attempt of this batch (or of a
        later one) raises AttemptSuperseded: a zombie driver never replaces the commit of the
        driver that took over. See ``commits.commit_batch`` for the checks that raise
        CommitConflict.
        """

        def work(connection: Connection) -> BatchCommit:
            started = time.perf_counter()
            now = self.now()
            done = commits.commit_batch(
                connection,
                root,
                query_id,
                batch_id,
                infos,
                now,
                replace=replace,
                duplicates=duplicates,
                run=run,
                holders=holders,
            )
            if run is not None:
                batch_intents.settle(connection, run, suspects, now)
            took = (time.perf_counter() - started) * 1000
            if metrics is not None:
                batch_metrics.record_batch_metrics(
                    connection, root, query_id, batch_id, with_fields(metrics, commit_ms=took), now
                )
            return with_fields(done, commit_ms=took)

        return self._run("commit batch", work, conflict)

    def rewind_query(
        self,
        root: str,
        query_id: str,
        batch_id: int,
        expected: Mapping[StoreId, CheckpointRef],
        *,
        restart: Collection[StoreId] = (),
        reason: str,
        run_id: int | None = None,
        reopened: Collection[StoreId] = (),
    ) -> rewind.Rewind:
        """Make ``batch_id`` the query's last committed batch, in one transaction (see
        ``rewind.rewind_query``); ``restart``: stores that start again from version 0;
        ``reopened``: stores whose version below the target loads again (the restore gave it
        its own snapshot), so it is no longer expired."""
        return self._run(
            "rewind query",
            lambda c: rewind.rewind_query(
                c,
                root,
                query_id,
                batch_id,
                expected,
                restart,
                reason,
                run_id,
                self.now(),
                reopened,
            ),
            conflict,
        )

    def committed_ids(
        self, root: str, query_id: str, batch_id: int
    ) -> dict[StoreId, CheckpointRef]:
        """The checkpoint each store committed in batch ``batch_id``; {} if it is not committed.
        The driver of batch ``b`` ships ``committed_ids(root, query, b - 1)`` to its tasks."""
        return self._read(
            "read committed ids",
            lambda c, v: commits.committed_ids(c, v, root, query_id, batch_id),
        )

    def latest_committed(self, root: str) -> dict[StoreId, CheckpointRef]:
        """Each store's latest committed (version, checkpoint id) below ``root``."""
        return self._read("read latest versions", lambda c, v: commits.latest_committed(c, v, root))

    def committed_before(
        self, root: str, query_id: str, batch_id: int
    ) -> dict[StoreId, CheckpointRef]:
        """Each store's newest commit by ``query_id`` from a batch before ``batch_id`` (else,
        for a store the query has no commit of, its latest): where a store the batch before
        did not open starts; never a commit of ``batch_id`` itself (a replay's own)."""
        return self._read(
            "read versions before a batch",
            lambda c, v: commits.committed_before(c, v, root, query_id, batch_id),
        )

    def commit_history(
        self,
        root: str,
        *,
        query_id: str | None = None,
        store: StoreId | None = None,
        limit: int = 100,
    ) -> list[CommitEntry]:
        return self._read(
            "read commit history",
            lambda c, v: commits.commit_history(
                c, v, root, query_id=query_id, store=store, limit=limit
            ),
        )

    def record_batch_metrics(
        self, root: str, query_id: str, batch_id: int, figures: BatchMetrics
    ) -> None:
        self._run(
            "record batch metrics",
            lambda c: batch_metrics.record_batch_metrics(
                c, root, query_id, batch_id, figures, self.now()
            ),
        )

    def batch_metrics(
        self, root: str, query_id: str, *, limit: int = 100
    ) -> list[RecordedBatchMetrics]:
        return self._read(
            "read batch metrics",
            lambda c, v: batch_metrics.batch_metrics_history(c, v, root, query_id, limit),
        )

    # --- the coordinator's records (written by commit_batch) -------------------------------

    def store_holders(self, root: str) -> dict[StoreId, tuple[str, CheckpointRef]]:
        """Each store's holder below ``root``: the worker that wrote its last committed
        checkpoint, and that checkpoint (where its warm copy lives)."""
        return self._run("read store holders", lambda c: holders_sql.store_holders(c, root))
