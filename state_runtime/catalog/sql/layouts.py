"""The SQL of operator layouts: each operator's partition count over time, and the one
transaction that switches a query's operators to a new layout (behind ``repartition``).

``switch_layout`` replaces what batch ``B`` committed for the switched operators: each store of
the new layout commits, at batch ``B``, a snapshot at the next version (``from_version``) with
a fresh checkpoint id; the batch's old entries are updated in place (a store in both layouts)
or removed (a store the new layout no longer has, whose latest version returns to 0), and the
files they named become orphans with the repartition as reason. The earlier versions of the
stores stay committed and leave by retention like any superseded version. Either all of it
happens or none: a crash leaves the old layout or the new one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import Layout, NewLayout
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import (
    FileState,
    checkpoint_files,
    commit_log,
    operator_layouts,
    stores,
)
from state_runtime.catalog.sql.findings import mark_verified
from state_runtime.catalog.sql.inventory import check_info, record_locked
from state_runtime.catalog.sql.lookups import ensure_stores, expired_below, lock_stores
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.rows import key_of
from state_runtime.catalog.sql.schema_history import OperatorStore
from state_runtime.catalog.sql.statements import among, chunks
from state_runtime.errors import CommitConflict, InvalidArgument
from state_runtime.identity import CheckpointRef, StoreId, validate_name
from state_runtime.store.checkpoint_info import CheckpointInfo


@dataclass(frozen=True)
class Switch:
    """What a switch changed: entries updated, removed and added, files orphaned."""

    replaced: int
    removed: int
    added: int
    orphaned_files: int


@dataclass(frozen=True)
class _SwitchStatements:
    """The switch's statements, built once a dialect; their values are bind parameters.
    ``orphan_files``, ``remove_entries``: ``entries`` (commit ids), ``now``, ``reason``;
    ``replace_entry``: ``entry``, ``new_version``, ``new_checkpoint``, ``new_file``, ``now``;
    ``commit_files``: ``files``, ``now``; ``set_latest``: ``store``, ``new_version``,
    ``new_checkpoint``, ``below``, ``now``; ``reset_stores``: ``stores``; ``batch_rows``:
    ``root``, ``query``, ``batch``; ``schemas``: ``root``."""

    orphan_files: Any
    replace_entry: Any
    remove_entries: Any
    commit_files: Any
    set_latest: Any
    reset_stores: Any
    batch_rows: Any
    schemas: Any


@functools.cache
def _switch_statements(dialect: str) -> _SwitchStatements:
    c, f, s = commit_log.c, checkpoint_files.c, stores.c
    held = checkpoint_files.alias("held")
    h = held.c
    named = held.join(
        commit_log,
        sa.and_(
            h.store_id == c.store_id, h.version == c.version, h.checkpoint_id == c.checkpoint_id
        ),
    )
    root = sa.bindparam("root", type_=s.checkpoint_root.type)
    below = sa.bindparam("below", type_=s.expired_through.type)
    return _SwitchStatements(
        # The files the batch's entries name, in one statement (each entry's delta and
        # snapshot share its version and checkpoint id).
        orphan_files=sa.update(checkpoint_files)
        .where(
            f.file_id.in_(
                sa.select(h.file_id)
                .select_from(named)
                .where(among(dialect, c.commit_id, "entries"))
            ),
            f.state.in_([constant(FileState.WRITTEN), constant(FileState.COMMITTED)]),
        )
        .values(
            state=FileState.ORPHAN.value,
            state_changed_at=sa.bindparam("now"),
            state_reason=sa.bindparam("reason"),
        ),
        replace_entry=sa.update(commit_log)
        .where(c.commit_id == sa.bindparam("entry"))
        .values(
            version=sa.bindparam("new_version"),
            checkpoint_id=sa.bindparam("new_checkpoint"),
            file_id=sa.bindparam("new_file"),
            committed_at=sa.bindparam("now"),
        ),
        remove_entries=sa.delete(commit_log).where(among(dialect, c.commit_id, "entries")),
        commit_files=sa.update(checkpoint_files)
        .where(among(dialect, f.file_id, "files"))
        .values(
            state=FileState.COMMITTED.value, state_changed_at=sa.bindparam("now"), state_reason=None
        ),
        set_latest=sa.update(stores)
        .where(s.store_id == sa.bindparam("store"))
        .values(
            latest_version=sa.bindparam("new_version"),
            latest_checkpoint_id=sa.bindparam("new_checkpoint"),
            expired_through=expired_below(below),  # below the new latest version
            last_committed_at=sa.bindparam("now"),
        ),
        reset_stores=sa.update(stores)
        .where(among(dialect, s.store_id, "stores"))
        .values(latest_version=0, latest_checkpoint_id=None, expired_through=0),
        batch_rows=sa.select(
            c.commit_id,
            c.store_id,
            c.version,
            c.checkpoint_id,
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
        )
        .join(stores, s.store_id == c.store_id)
        .where(
            s.checkpoint_root == root,
            c.query_id == sa.bindparam("query"),
            c.batch_id == sa.bindparam("batch"),
        ),
        schemas=sa.select(s.operator_id, s.store_name, s.key_schema, s.value_schema).where(
            s.checkpoint_root == root, s.key_schema.is_not(None)
        ),
    )


@functools.cache
def _layout_history_query(views: ReaderViews) -> sa.Select[Any]:
    """:func:`layout_history`'s statement, built once (``root``: a bind parameter)."""
    o = views.operator_layouts.c
    return (
        sa.select(views.operator_layouts)
        .where(o.checkpoint_root == sa.bindparam("root", type_=o.checkpoint_root.type))
        .order_by(o.operator_id, o.store_name, o.seq)
    )


def layout_history(connection: Connection, views: ReaderViews, root: str) -> list[Layout]:
    """Every layout recorded below ``root``, oldest first per operator."""
    rows = connection.execute(_layout_history_query(views), {"root": root})
    return [
        Layout(
            root=r.checkpoint_root,
            operator_id=r.operator_id,
            store_name=r.store_name,
            seq=r.seq,
            query_id=r.query_id,
            num_partitions=r.num_partitions,
            routing=list(r.routing),
            from_batch=r.from_batch,
            from_version=r.from_version,
            run_id=r.run_id,
            recorded_at=r.recorded_at,
        )
        for r in rows
    ]


def current_layouts(
    connection: Connection, views: ReaderViews, root: str
) -> dict[OperatorStore, Layout]:
    """Each operator's current (newest) layout below ``root``."""
    return {(x.operator_id, x.store_name): x for x in layout_history(connection, views, root)}


def record_layout(
    connection: Connection,
    root: str,
    query_id: str,
    layout: NewLayout,
    from_batch: int,
    now: datetime,
) -> None:
    """Record an operator's first layout (the runtime, when the query starts); a no-op when
    the operator has one."""
    validate_root(root)
    validate_name(query_id, "query id")
    if (layout.operator_id, layout.store_name) in current_layouts(connection, WRITE_LOOKUPS, root):
        return
    connection.execute(
        operator_layouts.insert(), _layout_row(root, query_id, layout, 0, from_batch, 0, None, now)
    )


def switch_layout(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    expected: Mapping[StoreId, CheckpointRef],
    snapshots: Sequence[CheckpointInfo],
    layouts: Sequence[NewLayout],
    reason: str,
    run_id: int | None,
    now: datetime,
) -> Switch:
    """Make ``layouts`` the query's layouts from batch ``batch_id + 1`` on (see the module).

    ``expected`` is what batch ``batch_id`` committed for the switched operators when the
    caller read the stores; if the catalog now says otherwise (a batch ran, or another
    repartition won), CommitConflict is raised and nothing changes. ``snapshots`` are the new
    stores' files, written and verified: one per partition of each new layout, all at one
    version.
    """
    validate_root(root)
    switched = {(x.operator_id, x.store_name): x for x in layouts}
    current = current_layouts(connection, WRITE_LOOKUPS, root)
    rows = _batch_rows(connection, root, query_id, batch_id, set(switched))
    lock_stores(connection, [r.store_id for r in rows])
    at_batch = {key_of(r).store: CheckpointRef(r.version, r.checkpoint_id) for r in rows}
    if at_batch != dict(expected):
        raise CommitConflict(
            f"batch {batch_id} of query {query_id} changed in the catalog since the stores were "
            "read (a batch ran, or another repartition switched first): plan it again"
        )
    wanted = {
        StoreId(x.operator_id, p, x.store_name) for x in layouts for p in range(x.num_partitions)
    }
    by_store = {info.store: info for info in snapshots}
    versions = {info.version for info in snapshots}
    if set(by_store) != wanted or len(versions) != 1:
        raise InvalidArgument(
            f"a switch needs one snapshot per new partition at one version; got {len(by_store)} "
            f"of {len(wanted)} at versions {sorted(versions)}"
        )
    version = versions.pop()
    ids = ensure_stores(connection, root, wanted, now, _schemas(connection, root, wanted))
    lock_stores(connection, ids.values())
    for info in snapshots:
        check_info(info)
    files = record_locked(connection, ids, snapshots, now, run_id=run_id)
    new_ids = [files[info.path].file_id for info in snapshots]
    mark_verified(connection, new_ids, None, now)
    do = _switch_statements(connection.dialect.name)
    kept = [r for r in rows if key_of(r).store in wanted]
    gone = [r for r in rows if key_of(r).store not in wanted]
    orphaned = 0
    for part in chunks([r.commit_id for r in rows]):  # before the entries change
        orphaned += connection.execute(
            do.orphan_files, {"entries": list(part), "now": now, "reason": reason}
        ).rowcount
    if kept:
        connection.execute(
            do.replace_entry,
            [
                {
                    "entry": r.commit_id,
                    "new_version": by_store[key_of(r).store].version,
                    "new_checkpoint": by_store[key_of(r).store].checkpoint_id,
                    "new_file": files[by_store[key_of(r).store].path].file_id,
                    "now": now,
                }
                for r in kept
            ],
        )
    for part in chunks([r.commit_id for r in gone]):
        connection.execute(do.remove_entries, {"entries": list(part)})
    had = {key_of(r).store for r in rows}
    added = [info for store, info in sorted(by_store.items()) if store not in had]
    if added:
        connection.execute(
            sa.insert(commit_log),
            [
                {
                    "query_id": query_id,
                    "batch_id": batch_id,
                    "store_id": ids[info.store],
                    "version": info.version,
                    "checkpoint_id": info.checkpoint_id,
                    "file_id": files[info.path].file_id,
                    "committed_at": now,
                }
                for info in added
            ],
        )
    for part in chunks(new_ids):
        connection.execute(do.commit_files, {"files": list(part), "now": now})
    connection.execute(
        do.set_latest,
        [
            {
                "store": ids[info.store],
                "new_version": info.version,
                "new_checkpoint": info.checkpoint_id,
                "below": max(info.version - 1, 0),
                "now": now,
            }
            for info in snapshots
        ],
    )
    for part in chunks(sorted({r.store_id for r in gone})):
        connection.execute(do.reset_stores, {"stores": list(part)})
    connection.execute(
        operator_layouts.insert(),
        [
            _layout_row(
                root,
                query_id,
                layout,
                _next_seq(current, layout),
                batch_id + 1,
                version,
                run_id,
                now,
            )
            for layout in layouts
        ],
    )
    return Switch(len(kept), len(gone), len(added), orphaned)


def _batch_rows(
    connection: Connection, root: str, query_id: str, batch_id: int, operators: set[OperatorStore]
) -> list[Any]:
    """Batch ``batch_id``'s commit-log entries for the stores of ``operators``."""
    rows = connection.execute(
        _switch_statements(connection.dialect.name).batch_rows,
        {"root": root, "query": query_id, "batch": batch_id},
    ).all()
    return [r for r in rows if (r.operator_id, r.store_name) in operators]


def _schemas(
    connection: Connection, root: str, wanted: set[StoreId]
) -> dict[StoreId, tuple[Any, Any]]:
    """The registered key and value schemas of each wanted store's operator."""
    rows = connection.execute(
        _switch_statements(connection.dialect.name).schemas, {"root": root}
    ).all()
    by_operator = {(r.operator_id, r.store_name): (r.key_schema, r.value_schema) for r in rows}
    return {
        x: by_operator[x.operator_id, x.store_name]
        for x in wanted
        if (x.operator_id, x.store_name) in by_operator
    }


def _next_seq(current: Mapping[OperatorStore, Layout], layout: NewLayout) -> int:
    """The sequence number of ``layout``, the operator's next."""
    before = current.get((layout.operator_id, layout.store_name))
    return 0 if before is None else before.seq + 1


def _layout_row(
    root: str,
    query_id: str,
    layout: NewLayout,
    seq: int,
    from_batch: int,
    from_version: int,
    run_id: int | None,
    now: datetime,
) -> dict[str, Any]:
    """An ``operator_layouts`` row."""
    return {
        "checkpoint_root": root,
        "operator_id": layout.operator_id,
        "store_name": layout.store_name,
        "seq": seq,
        "query_id": query_id,
        "num_partitions": layout.num_partitions,
        "routing": layout.routing,
        "from_batch": from_batch,
        "from_version": from_version,
        "run_id": run_id,
        "recorded_at": now,
    }
