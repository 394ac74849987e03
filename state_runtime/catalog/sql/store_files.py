"""One store's files and idle versions, read whole: what ``explain`` and the restore and
repair checks work on (a single store's answers, never a fleet's)."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import FileRecord
from state_runtime.catalog.schema.predicates import is_live
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.rows import file_columns, file_record


def live_files(connection: Connection, views: ReaderViews, store_id: int) -> list[FileRecord]:
    """The live files of one store, oldest versions first."""
    f = views.files.c
    rows = connection.execute(
        sa.select(*file_columns(views.files, views.stores))
        .join(views.stores, views.stores.c.store_id == f.store_id)
        .where(f.store_id == store_id, is_live(f))
        .order_by(f.version, f.kind, f.file_id)
    )
    return [file_record(row) for row in rows]


@functools.cache
def _idle_query(views: ReaderViews) -> sa.Select[Any]:
    c = views.commits.c
    store_id = sa.bindparam("store_id", type_=sa.BigInteger())
    return sa.select(c.version).where(c.store_id == store_id, c.file_id.is_(None))


def idle_versions(connection: Connection, views: ReaderViews, store_id: int) -> frozenset[int]:
    """The store's committed versions that changed nothing: their commits name no file."""
    return frozenset(connection.execute(_idle_query(views), {"store_id": store_id}).scalars())
