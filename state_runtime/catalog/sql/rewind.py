"""Rewinding a query's commits to an earlier batch, in one transaction (behind ``restore``).

After ``rewind_query(root, Q, B)`` the commit log of query ``Q`` ends at batch ``B``: each
store's latest committed version is the one batch ``B`` committed, so the runtime's next batch
``B + 1`` builds on it. The commit-log entries of the later batches are removed (a store's
versions must stay a linear chain, and the next batch commits those version numbers again) and
returned, so the caller records them with its run; their files become orphans whose reason
names the restore, and cleanup deletes them like any other orphan (the ledger keeps that
reason). A store named in ``restart`` (its state was lost, and the user accepted that) loses
every entry of the query and starts again from version 0; so does a store batch ``B`` does not
have (one a repartition dropped): its files become orphans, so no entry may keep naming them
(nor the version a repartition that adds the store back gives it, once the restarted stores
count from 1 again). The watermarks and metrics of the removed batches go with them: the
batches will run again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import CommitEntry
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.tables import (
    FileState,
    batch_metrics,
    batch_watermarks,
    checkpoint_files,
    commit_log,
    store_problems,
    stores,
)
from state_runtime.catalog.sql.lookups import lock_stores, mark_maintained, restored_expiry
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.rows import key_of
from state_runtime.catalog.sql.statements import chunks
from state_runtime.errors import CommitConflict
from state_runtime.identity import CheckpointRef, StoreId, validate_name, validate_non_negative


@dataclass(frozen=True)
class Rewind:
    """What a rewind changed: the commit-log entries it removed, the files it orphaned."""

    superseded: list[CommitEntry]
    orphaned_files: int
    resolved_problems: int


def rewind_query(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    expected: Mapping[StoreId, CheckpointRef],
    restart: Collection[StoreId],
    reason: str,
    run_id: int | None,
    now: datetime,
    reopened: Collection[StoreId] = (),
) -> Rewind:
    """Make batch ``batch_id`` the last committed batch of ``query_id`` (see the module).

    ``expected`` is what batch ``batch_id`` committed when the caller checked its files; if
    the catalog now says otherwise (a concurrent commit or restore), CommitConflict is raised
    and nothing changes. A store's versions up to the one below its target stay expired,
    except in a store of ``reopened``: the version below its target loads again (the restore
    wrote its own snapshot), and only versions below that one stay expired.
    """
    validate_root(root)
    validate_name(query_id, "query id")
    validate_non_negative(batch_id, "batch id")
    c, s = commit_log.c, stores.c
    rows = connection.execute(
        sa.select(
            c.commit_id,
            c.store_id,
            c.batch_id,
            c.version,
            c.checkpoint_id,
            c.committed_at,
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
        )
        .join(stores, s.store_id == c.store_id)
        .where(s.checkpoint_root == root, c.query_id == query_id)
    ).all()
    ids = {key_of(r).store: r.store_id for r in rows}
    lock_stores(connection, ids.values())
    if run_id is not None:
        mark_maintained(connection, ids.values(), run_id)
    at_batch = {
        key_of(r).store: CheckpointRef(r.version, r.checkpoint_id)
        for r in rows
        if r.batch_id == batch_id
    }
    if at_batch != dict(expected):
        raise CommitConflict(
            f"batch {batch_id} of query {query_id} changed in the catalog since it was checked "
            "(a concurrent commit or restore): plan the restore again"
        )
    kept = {store: ref for store, ref in at_batch.items() if store not in restart}
    dropped = [r for r in rows if r.batch_id > batch_id or key_of(r).store not in kept]
    for part in chunks([r.commit_id for r in dropped]):
        connection.execute(sa.delete(commit_log).where(c.commit_id.in_(part)))
    orphaned = resolved = 0
    for store, store_id in ids.items():
        target = kept.get(store)
        floor = 0 if target is None else target.version
        loads_from = floor - 1 if target is not None and store in reopened else floor
        orphaned += _orphan_above(connection, store_id, floor, reason, now)
        resolved += _resolve_above(connection, store_id, floor, reason, run_id, now)
        connection.execute(
            sa.update(stores)
            .where(s.store_id == store_id)
            .values(
                latest_version=floor,
                latest_checkpoint_id=None if target is None else target.checkpoint_id,
                expired_through=restored_expiry(loads_from),
            )
        )
    for table in (batch_watermarks, batch_metrics):
        connection.execute(
            sa.delete(table).where(
                table.c.checkpoint_root == root,
                table.c.query_id == query_id,
                table.c.batch_id > batch_id,
            )
        )
    superseded = [
        CommitEntry(
            key=key_of(r),
            query_id=query_id,
            batch_id=r.batch_id,
            ref=CheckpointRef(r.version, r.checkpoint_id),
            committed_at=r.committed_at,
        )
        for r in sorted(dropped, key=lambda r: (r.batch_id, r.store_id))
    ]
    return Rewind(superseded, orphaned, resolved)


def _orphan_above(
    connection: Connection, store_id: int, floor: int, reason: str, now: datetime
) -> int:
    """Files of the store above version ``floor`` that are written or committed become
    orphans with ``reason`` (files being deleted are left to their cleanup run)."""
    f = checkpoint_files.c
    return int(
        connection.execute(
            sa.update(checkpoint_files)
            .where(
                f.store_id == store_id,
                f.version > floor,
                f.state.in_([constant(FileState.WRITTEN), constant(FileState.COMMITTED)]),
            )
            .values(state=FileState.ORPHAN.value, state_changed_at=now, state_reason=reason)
        ).rowcount
    )


def _resolve_above(
    connection: Connection,
    store_id: int,
    floor: int,
    reason: str,
    run_id: int | None,
    now: datetime,
) -> int:
    """Open problems about versions above ``floor`` (or about no version, when the store
    restarts from empty) are resolved: those versions are no longer committed."""
    p = store_problems.c
    about = p.version > floor if floor else sa.true()
    return int(
        connection.execute(
            sa.update(store_problems)
            .where(p.store_id == store_id, p.resolved_at.is_(None), about)
            .values(resolved_at=now, resolved_by_run=run_id, resolution=reason)
        ).rowcount
    )
