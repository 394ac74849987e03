"""A page of stores: the keyset step of the paged catalog calls
(:mod:`state_runtime.catalog.api.pages`), one statement built once per shape."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.schema.reading_views import ReaderViews


@functools.cache
def _page_query(views: ReaderViews, by_root: bool) -> sa.Select[Any]:
    """:func:`page_ids`' statement (``after``, ``size``, ``root``: bind parameters)."""
    s = views.stores.c
    ids = sa.select(s.store_id).where(s.store_id > sa.bindparam("after", type_=sa.BigInteger()))
    if by_root:
        ids = ids.where(s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type))
    return ids.order_by(s.store_id).limit(sa.bindparam("size", type_=sa.Integer()))


def page_ids(
    connection: Connection, views: ReaderViews, root: str | None, after: int, size: int
) -> tuple[int, ...]:
    """The store ids, ascending, of the page of at most ``size`` stores (of ``root``, or all)
    after store id ``after``; none past the last store. A page's statements select by these
    ids, not by the range they span: a root's first page would span every store id below
    it, and a page's cost would grow with the catalog."""
    values = {"after": after, "size": size} | ({} if root is None else {"root": root})
    return tuple(connection.execute(_page_query(views, root is not None), values).scalars())
