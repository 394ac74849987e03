"""The commit protocol's statements (``commits.py``, ``batch_intents.py``), built once per
dialect with their values as bind parameters: a batch's start and commit run them at every
batch, and a statement built anew costs SQLAlchemy its construction and cache key each time
(docs/catalog.md, Performance)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from state_runtime.catalog.schema.tables import batch_intents, checkpoint_files, commit_log, stores
from state_runtime.catalog.sql.statements import among, dialect_insert


@dataclass(frozen=True)
class CommitStatements:
    """Parameters: ``run``, ``root``, ``query``, ``batch``,
    ``store_ids``, ``versions``, ``file_ids``, ``new_state``, ``reason``, ``now``."""

    later_intent: sa.Select[Any]
    """The newest intent of the query at ``batch`` or later but ``run``'s that began after
    ``run``'s (all of them when ``run``'s is gone), in one statement."""
    latest: sa.Select[Any]
    batch_entries: sa.Select[Any]
    files_at_versions: sa.Select[Any]
    set_state: sa.Update
    replace_entry: sa.Update
    """An entry re-committed in place: ``entry``, ``new_id``, ``new_file``, ``now``."""
    add_entries: sa.Insert
    bump_latest: sa.Update
    begin_intent: sa.Insert
    """An intent's row (none if the run has one): ``run``, ``checkpoint_root``, ``query_id``,
    ``batch_id``, ``operators``, ``started_at``."""
    settle_clean: sa.Update
    """``intent_run`` committed at ``now`` with no suspect: swept then."""
    settle_suspects: sa.Update
    """``intent_run`` committed at ``now`` with ``suspects`` (JSON) to sweep."""


@functools.cache
def commit_statements(dialect: str) -> CommitStatements:
    """The statements for ``dialect`` (``connection.dialect.name``)."""
    i, c, f, s = batch_intents.c, commit_log.c, checkpoint_files.c, stores.c
    now = sa.bindparam("now", type_=f.state_changed_at.type)
    later = sa.select(i.run, i.batch_id).where(
        i.checkpoint_root == sa.bindparam("root", type_=i.checkpoint_root.type),
        i.query_id == sa.bindparam("query"),
        i.batch_id >= sa.bindparam("batch"),
        i.run != sa.bindparam("run"),
    )
    newest = i.sequence.desc()
    mine = batch_intents.alias("mine")
    own = sa.select(mine.c.sequence).where(mine.c.run == sa.bindparam("run")).scalar_subquery()
    entry = sa.select(c.version).where(
        c.store_id == s.store_id,
        c.query_id == sa.bindparam("query"),
        c.batch_id == sa.bindparam("batch"),
    )
    settled = sa.bindparam("now", type_=i.committed_at.type)
    intent = i.run == sa.bindparam("intent_run")  # not "run": a column the SET could name
    settle = sa.update(batch_intents).where(intent).values(committed_at=settled)
    numbered: dict[str, Any] = {}
    if dialect != "postgresql":  # an identity there; here the write lock
        top = sa.func.coalesce(sa.func.max(i.sequence), 0)
        numbered["sequence"] = sa.select(top + 1).scalar_subquery()
    return CommitStatements(
        later_intent=later.where(sa.or_(own.is_(None), i.sequence > own)).order_by(newest).limit(1),
        latest=sa.select(s.store_id, s.latest_version).where(
            among(dialect, s.store_id, "store_ids")
        ),
        batch_entries=sa.select(c.commit_id, c.store_id, c.version, c.checkpoint_id)
        .join(stores, s.store_id == c.store_id)
        .where(
            c.query_id == sa.bindparam("query"),
            c.batch_id == sa.bindparam("batch"),
            s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type),
        ),
        files_at_versions=sa.select(
            f.file_id, f.store_id, f.version, f.checkpoint_id, f.state
        ).where(among(dialect, f.store_id, "store_ids"), among(dialect, f.version, "versions")),
        set_state=sa.update(checkpoint_files)
        .where(among(dialect, f.file_id, "file_ids"))
        .values(
            state=sa.bindparam("new_state"),
            state_changed_at=now,
            state_reason=sa.bindparam("reason", type_=f.state_reason.type),
        ),
        replace_entry=sa.update(commit_log)
        .where(c.commit_id == sa.bindparam("entry"))
        .values(
            checkpoint_id=sa.bindparam("new_id"),
            file_id=sa.bindparam("new_file"),
            committed_at=sa.bindparam("now", type_=c.committed_at.type),
        ),
        add_entries=sa.insert(commit_log),
        bump_latest=sa.update(stores)
        .where(among(dialect, s.store_id, "store_ids"))
        .values(
            latest_version=entry.scalar_subquery(),
            latest_checkpoint_id=entry.with_only_columns(c.checkpoint_id).scalar_subquery(),
            last_committed_at=sa.bindparam("now", type_=s.last_committed_at.type),
        ),
        # The run's own row already there (a retry after a lost COMMIT): nothing inserted;
        # any other conflict (a sequence number taken) still fails the transaction.
        begin_intent=dialect_insert(dialect, batch_intents)
        .values(**numbered)
        .on_conflict_do_nothing(index_elements=[i.run]),
        settle_clean=settle.values(suspects=sa.null(), swept_at=settled),
        settle_suspects=settle.values(
            suspects=sa.bindparam("suspects", type_=i.suspects.type), swept_at=sa.null()
        ),
    )
