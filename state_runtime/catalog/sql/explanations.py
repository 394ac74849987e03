"""``explain``: why one file is kept or may go, in the rule's words, and what a missing or
damaged file costs the retained versions."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime import retention as rule
from state_runtime.catalog.records import (
    Deletion,
    Explanation,
    StoreKey,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import FileState, Verification
from state_runtime.catalog.sql.lookups import files_at
from state_runtime.catalog.sql.retention import verdict_rows
from state_runtime.catalog.sql.rows import file_columns, file_record, store_id_of
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.store_files import idle_versions, live_files
from state_runtime.retention import RetentionPolicy, Verdict
from state_runtime.store.file_verification import MISSING


def explain(
    connection: Connection,
    views: ReaderViews,
    root: str,
    path: str,
    policy: RetentionPolicy,
    now: datetime,
    *,
    absent: bool = False,
) -> Explanation:
    """Why the file at ``path`` (relative to ``root``) is kept, or why it may be deleted.

    A file whose last verification failed, or that the caller found ``absent`` from storage,
    is never called needed: the answer says what is lost without it and what still loads.
    """
    s, f, d = views.stores.c, views.files.c, views.deletions.c
    matches = files_at(connection, views, root, [path], f.file_id, f.store_id, f.state)
    found = matches[0] if matches else None
    if found is None:
        return Explanation(
            root,
            path,
            Verdict.UNTRACKED,
            "the catalog has no record of this file; a reconciliation sweep records it as an "
            "orphan",
        )
    if found.state == FileState.DELETED.value:
        row = connection.execute(
            sa.select(
                *file_columns(views.files, views.stores),
                d.run_id,
                d.reason.label("ledger_reason"),
                d.deleted_at,
            )
            .select_from(views.files)
            .join(views.stores, s.store_id == f.store_id)
            .join(views.deletions, d.file_id == f.file_id)
            .where(f.file_id == found.file_id)
        ).one()
        deletion = Deletion(
            key=StoreKey(root, store_id_of(row)),
            path=path,
            size_bytes=row.size_bytes,
            run_id=row.run_id,
            reason=row.ledger_reason,
            deleted_at=row.deleted_at,
        )
        return Explanation(
            root,
            path,
            Verdict.DELETED,
            f"deleted at {deletion.deleted_at.isoformat()} by cleanup run {deletion.run_id}: "
            f"{deletion.reason}",
            file=file_record(row),
            deletion=deletion,
        )
    rows = verdict_rows(
        connection,
        views,
        policy,
        Scope(store_ids=(found.store_id,), dialect=connection.dialect.name),
        now,
        only_deletable=False,
        path=path,
    )
    verdict = rows[0][1]
    record = verdict.file
    if absent:
        note = MISSING
    elif record.verification is Verification.FAILED:
        note = record.verification_note or "its last verification failed"
    else:
        return Explanation(
            root,
            path,
            verdict.verdict,
            verdict.reason,
            file=record,
            needed_by=verdict.needed_by,
        )
    latest = connection.execute(
        sa.select(s.latest_version).where(s.store_id == found.store_id)
    ).scalar_one()
    holds = rule.still_intact(
        [r.facts() for r in live_files(connection, views, found.store_id)],
        latest,
        policy,
        path,
        idle_versions(connection, views, found.store_id),
    )
    return Explanation(
        root,
        path,
        Verdict.MISSING if note == MISSING else Verdict.DAMAGED,
        rule.damage_reason(record.kind, note, holds),
        file=record,
        needed_by=verdict.needed_by,
    )
