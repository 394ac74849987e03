"""Keyset paging over stores: a fleet-wide question asked one page of store ids at a time.

Every page is its own retried read (consistent within the page, not across pages), so what
a caller holds is one page's answer, whatever the fleet's size: the bounded memory of the
fleet-wide passes (health, the cleanup plan) stands on this one loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.api.transactions import CatalogBase
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.retention import Scope
from state_runtime.errors import InvalidArgument

T = TypeVar("T")
PAGE_STORES = 500
"""Stores per page by default: a page's answer is a few MB at most, a page's query well
under a second on PostgreSQL at any fleet size."""


@functools.cache
def _page_end_query(views: ReaderViews, by_root: bool) -> sa.Select[Any]:
    """:func:`_page_end`'s statement, built once per shape (``after``, ``size``, ``root``:
    bind parameters)."""
    s = views.stores.c
    ids = sa.select(s.store_id).where(s.store_id > sa.bindparam("after", type_=sa.BigInteger()))
    if by_root:
        ids = ids.where(s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type))
    page = ids.order_by(s.store_id).limit(sa.bindparam("size", type_=sa.Integer())).subquery("page")
    return sa.select(sa.func.max(page.c.store_id))


def _page_end(
    connection: Connection, views: ReaderViews, root: str | None, after: int, size: int
) -> int | None:
    """The last store id of the page of at most ``size`` stores after store id ``after``."""
    values = {"after": after, "size": size} | ({} if root is None else {"root": root})
    return connection.execute(_page_end_query(views, root is not None), values).scalar()


class PagedCalls(CatalogBase):
    """The keyset loop the paged catalog calls share."""

    def _pages(
        self,
        what: str,
        root: str | None,
        work: Callable[[Connection, ReaderViews, Scope], list[T]],
        page_size: int,
    ) -> Iterator[list[T]]:
        """``work``'s answer for each page of ``page_size`` stores (of ``root``, or all), in
        store id order; one transaction per page; pages with an empty answer are skipped."""
        if page_size < 1:
            raise InvalidArgument(f"page_size must be at least 1, got {page_size}")

        def page(start: int) -> Callable[[Connection, ReaderViews], tuple[int | None, list[T]]]:
            def read(c: Connection, v: ReaderViews) -> tuple[int | None, list[T]]:
                end = _page_end(c, v, root, start, page_size)
                return end, [] if end is None else work(c, v, Scope(root=root, ids=(start, end)))

            return read

        after = 0
        while True:
            end, found = self._read(f"{what} (stores after id {after})", page(after))
            if end is None:
                return
            if found:
                yield found
            after = end
