"""Batch intents: the bounded record that finds files of attempts the driver never heard of.

The driver writes an intent (root, query, batch, run, operators) in the transaction that
starts a batch, before any task runs, and settles it in the batch's commit transaction,
naming the *suspect* stores: those whose chosen report came from a retried task, and those
with duplicate reports (all of them when Spark may speculate). A normal batch settles with
no suspect and is never looked at again. Maintenance sweeps only intents that are settled
with suspects, or that never settled (the driver died or the batch failed) and are older
than the grace: it lists just those stores' folders and records the files of the batch's
version the catalog lacks, which then follow the retention rule like any orphan. See
docs/architecture.md, "Attempts the driver never hears of".
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import AttemptSweep, BatchStart, Suspects
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import RunKind, RunOutcome, batch_intents, maintenance_runs
from state_runtime.catalog.sql.commit_statements import commit_statements
from state_runtime.catalog.sql.commits import committed_ids, latest_entry
from state_runtime.catalog.sql.layouts import current_layouts
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.rows import store_id_of
from state_runtime.catalog.sql.statements import chunks
from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef, StoreId, validate_name, validate_non_negative


def begin_batch(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    run: str,
    operators: Sequence[tuple[int, str, int]],
    now: datetime,
) -> BatchStart:
    """Record the intent of ``run`` (its operators as (operator id, store name, partitions))
    and read what the batch starts from."""
    validate_root(root)
    validate_name(query_id, "query id")
    validate_non_negative(batch_id, "batch id")
    if not 1 <= len(run) <= 32 or not run.isalnum():
        raise InvalidArgument(f"batch run id {run!r}: expected 1 to 32 letters or digits")
    last = latest_entry(connection, WRITE_LOOKUPS, root, query_id)
    previous = (
        committed_ids(connection, WRITE_LOOKUPS, root, query_id, batch_id - 1) if batch_id else {}
    )
    connection.execute(  # a retry after a lost COMMIT finds its own intent: nothing to insert
        commit_statements(connection.dialect.name).begin_intent,
        {
            "run": run,
            "checkpoint_root": root,
            "query_id": query_id,
            "batch_id": batch_id,
            "operators": [list(op) for op in operators],
            "started_at": now,
        },
    )
    restored = restored_to(connection, root, query_id)
    restarted_base = (
        batch_id > 0
        and not previous
        and restored != batch_id - 1
        and restored_to(connection, root, query_id, batch_id - 1) is not None
    )
    wanted = {(operator_id, name) for operator_id, name, _ in operators}
    return BatchStart(
        last_batch=None if last is None else last[0],
        last_store=None if last is None else last[1],
        previous=previous,
        restored=restored,
        restarted_base=restarted_base,
        expired=expired_bases(connection, root, previous),
        layouts={
            key: layout
            for key, layout in current_layouts(connection, WRITE_LOOKUPS, root).items()
            if key in wanted and layout.query_id == query_id
        },
    )


def expired_bases(
    connection: Connection, root: str, previous: dict[StoreId, CheckpointRef]
) -> dict[StoreId, int]:
    """The stores whose version in ``previous`` has expired, with their ``expired_through``."""
    if not previous:
        return {}
    s = WRITE_LOOKUPS.stores.c
    rows = connection.execute(
        sa.select(s.operator_id, s.partition_id, s.store_name, s.expired_through).where(
            s.checkpoint_root == root, s.expired_through > 0
        )
    )
    through = {store_id_of(r): int(r.expired_through) for r in rows}
    return {
        store: through[store]
        for store, ref in previous.items()
        if store in through and ref.version <= through[store]
    }


def restored_to(
    connection: Connection, root: str, query_id: str, batch_id: int | None = None
) -> int | None:
    """The batch the query's latest successful restore returned it to (with ``batch_id``: its
    latest to that batch that ended after the query's last commit of a batch before it, so
    one that could have restarted the stores the next batch starts from), or None.

    The commit log alone cannot say where a query stands once a restore restarted every store
    from empty (their entries are gone): the restore's run is the record of that position.
    Restores before the run named its root (catalog revision 0014 and older) are not read."""
    params: dict[str, Any] = {"root": root, "query_id": query_id}
    if batch_id is not None:
        params["batch_id"] = batch_id
    row = connection.execute(_restored_to_query(batch_id is not None), params).first()
    return None if row is None else int(row[0])


@functools.cache
def _restored_to_query(to_batch: bool) -> sa.Select[Any]:
    """:func:`restored_to`'s statement, built once per form (``root``, ``query_id`` and, with
    ``to_batch``, ``batch_id``: bind parameters)."""
    r = maintenance_runs.c
    query = sa.select(r.parameters["to_batch"].as_integer()).where(
        r.kind == RunKind.RESTORE.value,
        r.outcome == constant(RunOutcome.SUCCEEDED),
        r.parameters["root"].as_string() == sa.bindparam("root", type_=sa.String()),
        r.parameters["query_id"].as_string() == sa.bindparam("query_id", type_=sa.String()),
    )
    if to_batch:
        batch = sa.bindparam("batch_id", type_=sa.Integer())
        views = WRITE_LOOKUPS
        c, s = views.commits.c, views.stores.c
        # the query's newest commit of a batch before ``batch_id``: a restore older than it
        # did not restart the stores the batch builds on (a later batch committed over them)
        newest = (
            sa.select(sa.func.max(c.committed_at))
            .join(views.stores, s.store_id == c.store_id)
            .where(
                s.checkpoint_root == sa.bindparam("root", type_=sa.String()),
                c.query_id == sa.bindparam("query_id", type_=sa.String()),
                c.batch_id < batch,
            )
            .scalar_subquery()
        )
        query = query.where(
            r.parameters["to_batch"].as_integer() == batch,
            sa.or_(newest.is_(None), r.ended_at >= newest),
        )
    return query.order_by(r.run_id.desc()).limit(1)


def settle(connection: Connection, run: str, suspects: Suspects, now: datetime) -> None:
    """Mark ``run`` committed; with no suspect it is swept already (nothing to look for)."""
    listed: Any = (
        {"all": True}
        if suspects == "all"
        else {"stores": [[s.operator_id, s.partition_id, s.store_name] for s in sorted(suspects)]}
    )
    built = commit_statements(connection.dialect.name)
    if suspects != "all" and not suspects:
        connection.execute(built.settle_clean, {"intent_run": run, "now": now})
    else:
        connection.execute(
            built.settle_suspects, {"intent_run": run, "now": now, "suspects": listed}
        )


def open_sweeps(
    connection: Connection, views: ReaderViews, started_before: datetime, limit: int
) -> list[AttemptSweep]:
    """Intents to sweep, oldest first: settled with suspects, or never settled, and started
    before ``started_before`` (a younger one may still have attempts running)."""
    i = views.batch_intents.c
    rows = connection.execute(
        sa.select(views.batch_intents)
        .where(i.swept_at.is_(None), i.started_at < started_before)
        .order_by(i.started_at)
        .limit(limit)
    ).all()
    return [_sweep_of(connection, views, row) for row in rows]


def _sweep_of(connection: Connection, views: ReaderViews, row: Any) -> AttemptSweep:
    """The store folders and the version to look at for one intent.

    Committed: the suspects, at the version the batch committed. Never settled: every store
    of the intent's operators, at the version after the previous batch's (1 for a new store).
    """
    committed = row.committed_at is not None
    mine = committed_ids(connection, views, row.checkpoint_root, row.query_id, row.batch_id)
    if committed:
        suspects = row.suspects or {}
        stores = (
            set(mine)
            if suspects.get("all")
            else {StoreId(op, p, name) for op, p, name in suspects.get("stores", [])}
        )
        targets = {s: mine[s].version for s in stores if s in mine}
    else:
        before = (
            committed_ids(connection, views, row.checkpoint_root, row.query_id, row.batch_id - 1)
            if row.batch_id
            else {}
        )
        targets = {}
        for op, name, partitions in row.operators:
            for p in range(partitions):
                store = StoreId(op, p, name)
                ref = before.get(store)
                targets[store] = 1 if ref is None else ref.version + 1
                if store in mine and mine[store].version != targets[store]:
                    targets[store] = mine[store].version  # a later run committed this batch
    return AttemptSweep(
        run=row.run,
        root=row.checkpoint_root,
        query_id=row.query_id,
        batch_id=row.batch_id,
        committed=committed,
        targets=targets,
    )


def finish_sweeps(
    connection: Connection, runs: Collection[str], now: datetime, forget_before: datetime
) -> int:
    """Mark ``runs`` swept, and forget intents swept before ``forget_before``, but each
    query's newest (the order a zombie driver's commit is checked against, see
    ``superseding_intent``); the number forgotten."""
    i = batch_intents.c
    for part in chunks(sorted(runs)):
        connection.execute(sa.update(batch_intents).where(i.run.in_(part)).values(swept_at=now))
    newest = sa.select(sa.func.max(i.sequence)).group_by(i.checkpoint_root, i.query_id)
    forgotten = sa.delete(batch_intents).where(
        i.swept_at < forget_before, i.sequence.not_in(newest)
    )
    return int(connection.execute(forgotten).rowcount)
