"""The commit protocol: a micro-batch's checkpoints become committed in one transaction.

Batch ``b`` of a query commits one (version, checkpoint id) per store, all partitions of all
stateful operators together. The commit log then names exactly those ids; their files turn
committed; other attempts at the same versions turn orphan. Re-committing a batch (a replay)
replaces its entries in the same transaction and orphans the files it replaced. Each store's
committed versions stay a linear chain: version ``v`` must build on the committed ``v - 1``.
The open problems about a file of a checkpoint the commit replaced (a loss the runtime
recorded, then a replay that wrote the version again) are resolved in the same transaction.
A version that changed nothing is a commit of its parent's checkpoint: its entry has the
parent's id and no file (``file_id`` NULL), and nothing is recorded for it, so its replay or
retry always commits.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import BatchCommit, CommitEntry
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import (
    FileState,
)
from state_runtime.catalog.sql.commit_statements import commit_statements
from state_runtime.catalog.sql.findings import close_unneeded
from state_runtime.catalog.sql.holders import record_holders
from state_runtime.catalog.sql.inventory import RecordedFile, check_info, record_locked
from state_runtime.catalog.sql.lookups import committed_ids_at, ensure_stores, lock_stores
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.rows import key_of, store_id_of
from state_runtime.catalog.sql.statements import chunks
from state_runtime.errors import AttemptSuperseded, CommitConflict, InvalidArgument
from state_runtime.identity import (
    CheckpointRef,
    StoreId,
    validate_name,
    validate_non_negative,
)
from state_runtime.store.checkpoint_info import CheckpointInfo


def commit_batch(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    infos: Sequence[CheckpointInfo],
    now: datetime,
    *,
    replace: bool,
    duplicates: Sequence[CheckpointInfo] = (),
    run: str | None = None,
    holders: Mapping[StoreId, str] | None = None,
) -> BatchCommit:
    """Commit batch ``batch_id`` of ``query_id``: one checkpoint per store, atomically.

    ``duplicates``: other attempts' checkpoints the driver saw for this batch (duplicate
    reports); they are recorded too, and turn orphan with the commit. ``holders``: the worker
    that wrote each store's checkpoint (stores the batch does not commit: left out).

    Raises CommitConflict, leaving the catalog untouched, when a named file is being deleted,
    the batch is already committed with other ids and ``replace`` is False, a replay leaves
    out a store the batch had, a replaced version already has successors, a version is not
    the store's next one, or a base checkpoint id is not the committed id of ``version - 1``;
    and AttemptSuperseded when ``run``'s intent is older than another of this batch or a later
    one of the query (:func:`superseding_intent`).
    """
    validate_root(root)
    validate_name(query_id, "query id")
    validate_non_negative(batch_id, "batch id")
    if not infos:
        raise InvalidArgument(f"batch {batch_id} of query {query_id} commits no store")
    seen: set[StoreId] = set()
    for info in infos:
        if info.store in seen:
            raise InvalidArgument(f"batch {batch_id} names store {info.store} twice")
        seen.add(info.store)

    chosen = {info.path for info in infos}
    extra = {d.path: d for d in duplicates if d.path not in chosen}
    every = [*infos, *extra.values()]
    for info in every:
        check_info(info)
    ids = ensure_stores(connection, root, (i.store for i in every), now)
    lock_stores(connection, ids.values())
    if run is not None:  # after the locks: a newer attempt's commit is then visible, or after
        newer = superseding_intent(connection, root, query_id, batch_id, run)
        if newer is not None:
            raise AttemptSuperseded(
                f"batch {batch_id} of query {query_id}: attempt {run} is older than attempt "
                f"{newer[0]} of batch {newer[1]}, which began after it (another driver took "
                "the query over); this commit is refused so that the newer attempt's stands"
            )
    files = record_locked(connection, ids, every, now)
    by_store = {ids[i.store]: i for i in infos}
    latest = _latest(connection, by_store)
    old = _batch_entries(connection, root, query_id, batch_id)
    missing = set(old) - set(by_store)
    if missing:
        raise CommitConflict(
            f"re-commit of batch {batch_id} (query {query_id}) leaves out "
            f"{len(missing)} store(s) the committed batch has; a replay must cover them all"
        )
    changed = {
        sid: entry
        for sid, entry in old.items()
        if (entry["version"], entry["checkpoint_id"])
        != (by_store[sid].version, by_store[sid].checkpoint_id)
    }
    if changed and not replace:
        raise CommitConflict(
            f"batch {batch_id} of query {query_id} is already committed with other checkpoint "
            "ids (pass replace=True to re-commit a replayed batch)"
        )
    new = {sid: info for sid, info in by_store.items() if sid not in old or sid in changed}
    _check_not_deleted(new.values(), files, batch_id)
    parents = committed_ids_at(
        connection, {(sid, info.version - 1) for sid, info in new.items() if info.version > 1}
    )
    for sid, info in new.items():
        _check_linear(info, sid, old.get(sid), latest[sid], parents, batch_id)

    replaced = {
        by_store[sid].store: CheckpointRef(e["version"], e["checkpoint_id"])
        for sid, e in changed.items()
    }
    orphaned = _apply(connection, query_id, batch_id, new, changed, files, now)
    if holders:
        refs = {info.store: info.ref for info in infos}
        located = {s: (w, refs[s]) for s, w in holders.items() if s in refs}
        record_holders(connection, ids, located, now)
    closed = close_unneeded(
        connection,
        {sid: info.version for sid, info in new.items()},
        f"no committed version reads the file any more: batch {batch_id} of query {query_id} "
        "committed its version with another checkpoint",
        now,
    )
    return BatchCommit(
        query_id=query_id,
        batch_id=batch_id,
        committed={info.store: info.ref for info in infos},
        replaced=replaced,
        orphaned_files=orphaned,
        closed_problems=closed,
    )


def superseding_intent(
    connection: Connection, root: str, query_id: str, batch_id: int, run: str
) -> tuple[str, int] | None:
    """The newest intent (run, batch) of the query that began after ``run``'s, at batch
    ``batch_id`` or later, or None. By the intents' sequence, the database's order, never a
    clock. An intent that is gone (forgotten by the attempt sweep, which keeps each query's
    newest) is older than every intent still held."""
    row = connection.execute(
        commit_statements(connection.dialect.name).later_intent,
        {"root": root, "query": query_id, "batch": batch_id, "run": run},
    ).first()
    return None if row is None else (str(row.run), int(row.batch_id))


def _check_not_deleted(
    infos: Iterable[CheckpointInfo], files: dict[str, RecordedFile], batch_id: int
) -> None:
    """Refuse to commit a file that cleanup is deleting or deleted. Only what the commit newly
    names is checked: a batch already committed with the same ids is a no-op whatever
    happened to its files since, and a version that changed nothing names no file at all."""
    for info in infos:
        recorded = files.get(info.path) if info.has_file else None
        if recorded is not None and recorded.state in (FileState.DELETING, FileState.DELETED):
            raise CommitConflict(
                f"batch {batch_id} names a file that cleanup run {recorded.claimed_by_run} is "
                f"deleting or deleted; replay the batch to write a new checkpoint",
                store=info.store,
                version=info.version,
                checkpoint_id=info.checkpoint_id,
                path=info.path,
            )


def _check_linear(
    info: CheckpointInfo,
    store_id: int,
    old: dict[str, Any] | None,
    latest: int,
    parents: dict[tuple[int, int], str],
    batch_id: int,
) -> None:
    where: dict[str, Any] = {
        "store": info.store,
        "version": info.version,
        "checkpoint_id": info.checkpoint_id,
    }
    if old is not None:
        if info.version != old["version"]:
            raise CommitConflict(
                f"replay of batch {batch_id} commits version {info.version}, the batch had "
                f"committed version {old['version']}",
                **where,
            )
        if latest != old["version"]:
            raise CommitConflict(
                f"cannot replace version {old['version']} of batch {batch_id}: version {latest} "
                "is already committed on top of it",
                **where,
            )
    elif latest and info.version != latest + 1:
        raise CommitConflict(
            f"version {info.version} is not the store's next version (latest committed: {latest})",
            **where,
        )
    parent = parents.get((store_id, info.version - 1))
    if parent is not None and info.base_checkpoint_id != parent:
        raise CommitConflict(
            f"checkpoint builds on {info.version - 1}_{info.base_checkpoint_id}, but version "
            f"{info.version - 1} is committed as {info.version - 1}_{parent}",
            **where,
        )


def _apply(
    connection: Connection,
    query_id: str,
    batch_id: int,
    new: dict[int, CheckpointInfo],
    changed: dict[int, dict[str, Any]],
    files: dict[str, RecordedFile],
    now: datetime,
) -> int:
    """Write the commit: replace entries, insert new ones, move file states, bump latest.

    Set-based statements (a few per 400 stores), so a batch of many partitions costs a
    handful of round trips rather than several per store. A replayed entry is updated in
    place (same batch, store and version; a new id): the runtime's role has no DELETE.
    """
    built = commit_statements(connection.dialect.name)
    if changed:
        connection.execute(
            built.replace_entry,
            [
                {
                    "entry": entry["commit_id"],
                    "new_id": new[sid].checkpoint_id,
                    "new_file": _file_id(new[sid], files),
                    "now": now,
                }
                for sid, entry in changed.items()
            ],
        )
    if not new:
        return 0
    added = [(sid, info) for sid, info in new.items() if sid not in changed]
    if added:
        connection.execute(
            built.add_entries,
            [
                {
                    "query_id": query_id,
                    "batch_id": batch_id,
                    "store_id": sid,
                    "version": info.version,
                    "checkpoint_id": info.checkpoint_id,
                    "file_id": _file_id(info, files),
                    "committed_at": now,
                }
                for sid, info in added
            ],
        )
    replaced = {(sid, e["version"], e["checkpoint_id"]) for sid, e in changed.items()}
    committed = {(sid, i.version, i.checkpoint_id) for sid, i in new.items()}
    at_versions = _files_at_versions(connection, {(sid, v) for sid, v, _ in committed | replaced})
    orphaned = _set_state(
        connection,
        [fid for fid, key, state in at_versions if key in replaced and state in _REPLACEABLE],
        FileState.ORPHAN,
        f"replaced by a re-commit of batch {batch_id} (query {query_id}) at {now.isoformat()}",
        now,
    )
    _set_state(
        connection,
        [fid for fid, key, state in at_versions if key in committed and state in _COMMITTABLE],
        FileState.COMMITTED,
        None,
        now,
    )
    orphaned += _set_state(
        connection,
        [
            fid
            for fid, key, state in at_versions
            if key not in committed and key not in replaced and state == FileState.WRITTEN
        ],
        FileState.ORPHAN,
        f"another attempt at this version was committed by batch {batch_id} (query {query_id})",
        now,
    )
    for part in chunks(sorted(new)):
        connection.execute(
            built.bump_latest,
            {"store_ids": list(part), "query": query_id, "batch": batch_id, "now": now},
        )
    return orphaned


def _file_id(info: CheckpointInfo, files: dict[str, RecordedFile]) -> int | None:
    """The file a commit-log entry names: None for a version that changed nothing (it
    commits its parent's checkpoint, which has no file of its own at this version)."""
    return files[info.path].file_id if info.has_file else None


def _files_at_versions(
    connection: Connection, pairs: set[tuple[int, int]]
) -> list[tuple[int, tuple[int, int, str], str]]:
    """(file id, (store id, version, checkpoint id), state) of every file at the given
    (store id, version) pairs: per-column IN lists on the checkpoint index, exact pairs kept."""
    statement = commit_statements(connection.dialect.name).files_at_versions
    found = []
    for part in chunks(sorted(pairs)):
        rows = connection.execute(
            statement,
            {
                "store_ids": sorted({sid for sid, _ in part}),
                "versions": sorted({v for _, v in part}),
            },
        )
        found += [
            (r.file_id, (r.store_id, r.version, r.checkpoint_id), r.state)
            for r in rows
            if (r.store_id, r.version) in pairs
        ]
    return found


def _set_state(
    connection: Connection, file_ids: list[int], state: FileState, reason: str | None, now: datetime
) -> int:
    """Move the files to ``state`` with ``reason``; the number of files moved."""
    statement = commit_statements(connection.dialect.name).set_state
    moved = 0
    for part in chunks(file_ids):
        values = {"file_ids": list(part), "new_state": state.value, "reason": reason, "now": now}
        moved += connection.execute(statement, values).rowcount
    return moved


_REPLACEABLE = (FileState.WRITTEN.value, FileState.COMMITTED.value)
_COMMITTABLE = (FileState.WRITTEN.value, FileState.ORPHAN.value)


def _latest(connection: Connection, ids: dict[int, CheckpointInfo]) -> dict[int, int]:
    statement = commit_statements(connection.dialect.name).latest
    found: dict[int, int] = {}
    for part in chunks(sorted(ids)):
        rows = connection.execute(statement, {"store_ids": list(part)})
        found.update({r.store_id: r.latest_version for r in rows})
    return found


def _batch_entries(
    connection: Connection, root: str, query_id: str, batch_id: int
) -> dict[int, dict[str, Any]]:
    rows = connection.execute(
        commit_statements(connection.dialect.name).batch_entries,
        {"query": query_id, "batch": batch_id, "root": root},
    )
    return {r.store_id: dict(r._mapping) for r in rows}


@functools.cache
def _committed_ids_query(views: ReaderViews) -> sa.Select[Any]:
    """:func:`committed_ids`' statement, built once (its values: bind parameters)."""
    c, s = views.commits.c, views.stores.c
    return (
        sa.select(s.operator_id, s.partition_id, s.store_name, c.version, c.checkpoint_id)
        .join(views.stores, s.store_id == c.store_id)
        .where(
            s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type),
            c.query_id == sa.bindparam("query_id", type_=c.query_id.type),
            c.batch_id == sa.bindparam("batch_id", type_=c.batch_id.type),
        )
    )


def committed_ids(
    connection: Connection, views: ReaderViews, root: str, query_id: str, batch_id: int
) -> dict[StoreId, CheckpointRef]:
    """The (version, checkpoint id) batch ``batch_id`` committed for each store; {} if none."""
    validate_non_negative(batch_id, "batch id")
    values = {"root": root, "query_id": query_id, "batch_id": batch_id}
    rows = connection.execute(_committed_ids_query(views), values)
    return {store_id_of(r): CheckpointRef(r.version, r.checkpoint_id) for r in rows}


@functools.cache
def _latest_entry_query(views: ReaderViews) -> sa.Select[Any]:
    """:func:`latest_entry`'s statement, built once (``root``, ``query_id``: bind
    parameters)."""
    c, s = views.commits.c, views.stores.c
    return (
        sa.select(c.batch_id, s.operator_id, s.partition_id, s.store_name)
        .join(views.stores, s.store_id == c.store_id)
        .where(
            s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type),
            c.query_id == sa.bindparam("query_id", type_=c.query_id.type),
        )
        .order_by(c.batch_id.desc())
        .limit(1)
    )


def latest_entry(
    connection: Connection, views: ReaderViews, root: str, query_id: str
) -> tuple[int, StoreId] | None:
    """The query's last committed batch below ``root`` and one of its stores; None if none."""
    values = {"root": root, "query_id": query_id}
    row = connection.execute(_latest_entry_query(views), values).first()
    return None if row is None else (row.batch_id, store_id_of(row))


def latest_committed(
    connection: Connection, views: ReaderViews, root: str
) -> dict[StoreId, CheckpointRef]:
    """Each store's latest committed (version, checkpoint id) below ``root``."""
    s = views.stores.c
    rows = connection.execute(
        sa.select(
            s.operator_id, s.partition_id, s.store_name, s.latest_version, s.latest_checkpoint_id
        ).where(s.checkpoint_root == root, s.latest_version > 0)
    )
    return {store_id_of(r): CheckpointRef(r.latest_version, r.latest_checkpoint_id) for r in rows}


@functools.cache
def _committed_before_query(views: ReaderViews) -> sa.Select[Any]:
    """:func:`committed_before`'s statement, built once: the root, query id and batch id are
    bind parameters. Per store below the root: ``mine`` has the query's newest batch before
    the batch and its earliest version at or after it; ``before`` is the query's commit of
    that newest batch, ``parent`` the commit (by any query) of the version below that
    earliest one, which exists unless that version is 1 or a restore removed the chain."""
    c, s = views.commits.c, views.stores.c
    batch = sa.bindparam("batch_id", type_=c.batch_id.type)
    query_id = sa.bindparam("query_id", type_=c.query_id.type)
    mine = (
        sa.select(
            c.store_id,
            sa.func.max(sa.case((c.batch_id < batch, c.batch_id))).label("batch_before"),
            sa.func.min(sa.case((c.batch_id >= batch, c.version))).label("first_since"),
        )
        .where(c.query_id == query_id)
        .group_by(c.store_id)
        .subquery("mine")
    )
    before = views.commits.alias("before")
    parent = views.commits.alias("parent")
    b, p, m = before.c, parent.c, mine.c
    return (
        sa.select(
            s.operator_id,
            s.partition_id,
            s.store_name,
            sa.func.coalesce(b.version, p.version, s.latest_version).label("version"),
            sa.func.coalesce(b.checkpoint_id, p.checkpoint_id, s.latest_checkpoint_id).label(
                "checkpoint_id"
            ),
        )
        .select_from(views.stores)
        .outerjoin(mine, m.store_id == s.store_id)
        .outerjoin(
            before,
            (b.store_id == s.store_id) & (b.query_id == query_id) & (b.batch_id == m.batch_before),
        )
        .outerjoin(
            parent,
            (p.store_id == s.store_id)
            & m.batch_before.is_(None)
            & (p.version == m.first_since - 1),
        )
        .where(
            s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type),
            sa.or_(
                m.batch_before.is_not(None),
                p.version.is_not(None),
                m.store_id.is_(None) & (s.latest_version > 0),
            ),
        )
    )


def committed_before(
    connection: Connection, views: ReaderViews, root: str, query_id: str, batch_id: int
) -> dict[StoreId, CheckpointRef]:
    """What batch ``batch_id`` of ``query_id`` builds on, per store below ``root``: the
    query's newest commit from a batch before it; for a store whose commits by the query are
    all of ``batch_id`` or later, the commit of the version below the earliest of them (one
    another query committed, or the query before its older commits were removed), nothing
    when that is version 1 (a store first opened then, or restarted from empty before it): a
    replay of ``batch_id`` builds on what came before it, never on its own commit; a store
    the query has no commit of (its commits the log no longer holds, or another query's):
    its latest committed version."""
    values = {"root": root, "query_id": query_id, "batch_id": batch_id}
    rows = connection.execute(_committed_before_query(views), values)
    return {store_id_of(r): CheckpointRef(r.version, r.checkpoint_id) for r in rows}


_STORE_FIELDS = ("operator_id", "partition_id", "store_name")


@functools.cache
def _history_query(views: ReaderViews, by_query: bool, by_store: bool) -> sa.Select[Any]:
    """:func:`commit_history`'s statement, built once per shape: the root, ``limit`` and, if
    filtered on, the query id and the store's fields are bind parameters."""
    c, s = views.commits.c, views.stores.c
    query = (
        sa.select(
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
            c.query_id,
            c.batch_id,
            c.version,
            c.checkpoint_id,
            c.committed_at,
        )
        .join(views.stores, s.store_id == c.store_id)
        .where(s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type))
        .order_by(c.batch_id.desc(), s.operator_id, s.partition_id, s.store_name)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )
    if by_query:
        query = query.where(c.query_id == sa.bindparam("query_id", type_=c.query_id.type))
    if by_store:
        query = query.where(
            *(s[name] == sa.bindparam(name, type_=s[name].type) for name in _STORE_FIELDS)
        )
    return query


def commit_history(
    connection: Connection,
    views: ReaderViews,
    root: str,
    *,
    query_id: str | None = None,
    store: StoreId | None = None,
    limit: int = 100,
) -> list[CommitEntry]:
    """Commit-log entries below ``root``, newest batch first."""
    values: dict[str, Any] = {"root": root, "limit": limit}
    if query_id is not None:
        values["query_id"] = query_id
    if store is not None:
        values.update({name: getattr(store, name) for name in _STORE_FIELDS})
    query = _history_query(views, query_id is not None, store is not None)
    return [
        CommitEntry(
            key=key_of(r),
            query_id=r.query_id,
            batch_id=r.batch_id,
            ref=CheckpointRef(r.version, r.checkpoint_id),
            committed_at=r.committed_at,
        )
        for r in connection.execute(query, values)
    ]
