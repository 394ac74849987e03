"""Where a page of stores ends: the keyset step of the paged catalog calls
(:mod:`state_runtime.catalog.api.pages`), one statement built once per shape."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.schema.reading_views import ReaderViews


@functools.cache
def _page_end_query(views: ReaderViews, by_root: bool) -> sa.Select[Any]:
    """:func:`page_end`'s statement (``after``, ``size``, ``root``: bind parameters)."""
    s = views.stores.c
    ids = sa.select(s.store_id).where(s.store_id > sa.bindparam("after", type_=sa.BigInteger()))
    if by_root:
        ids = ids.where(s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type))
    page = ids.order_by(s.store_id).limit(sa.bindparam("size", type_=sa.Integer())).subquery("page")
    return sa.select(sa.func.max(page.c.store_id))


def page_end(
    connection: Connection, views: ReaderViews, root: str | None, after: int, size: int
) -> int | None:
    """The last store id of the page of at most ``size`` stores (of ``root``, or all) after
    store id ``after``; None past the last store."""
    values = {"after": after, "size": size} | ({} if root is None else {"root": root})
    return connection.execute(_page_end_query(views, root is not None), values).scalar()
