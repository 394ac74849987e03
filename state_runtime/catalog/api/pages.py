"""Keyset paging over stores: a fleet-wide question asked one page of store ids at a time.

Every page is its own retried read (consistent within the page, not across pages), so what
a caller holds is a page's answer (a few, when it reads ahead: health's ``read_ahead``),
whatever the fleet's size: the bounded memory of the fleet-wide passes (health, the cleanup
plan) stands on this one loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.transactions import CatalogBase
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.pages import page_ids
from state_runtime.catalog.sql.scope import Scope
from state_runtime.errors import InvalidArgument

T = TypeVar("T")
PAGE_STORES = 500
"""Stores per page by default: a page's answer is a few MB at most, a page's query well
under a second on PostgreSQL at any fleet size."""


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
        store id order; one transaction per page; pages with an empty answer are skipped. A
        page of fewer than ``page_size`` stores is the last: a fleet smaller than a page is
        one transaction, not two (a store created after that page was read is the next
        call's, as it would be after an empty page)."""
        if page_size < 1:
            raise InvalidArgument(f"page_size must be at least 1, got {page_size}")

        def page(
            start: int,
        ) -> Callable[[Connection, ReaderViews], tuple[tuple[int, ...], list[T]]]:
            def read(c: Connection, v: ReaderViews) -> tuple[tuple[int, ...], list[T]]:
                ids = page_ids(c, v, root, start, page_size)
                scope = Scope(store_ids=ids, dialect=c.dialect.name)  # an array on PostgreSQL
                return ids, work(c, v, scope) if ids else []

            return read

        after: int | None = 0
        while after is not None:
            ids, found = self._read(f"{what} (stores after id {after})", page(after))
            if found:
                yield found
            after = ids[-1] if len(ids) == page_size else None
