"""The paged reads of a fleet (the cleanup plan, its counts, health, snapshot candidates):
each page's statements select the page's stores by id, whatever the catalog holds, and the
pages together answer what the unpaged read answers; on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.catalog.schema.tables import stores
from state_runtime.identity import StoreId
from tests.catalog.factory import LONG_AGO, Stream
from tests.statements import executed

NOW = LONG_AGO + timedelta(days=2)
POLICY = RetentionPolicy(retain_versions=2, window=timedelta(hours=1))
ROOTS = ("/data/checkpoints/query-a", "/data/checkpoints/query-b", "/data/checkpoints/query-c")
PAGE = 2


def fleet(catalog: Catalog) -> None:
    """Three queries of three stores, six versions each, store 0 with a snapshot at 4: every
    store has deletable files, and the last root's stores come after the others' ids."""
    for n, root in enumerate(ROOTS):
        stream = Stream(catalog, [StoreId(0, p) for p in range(3)], root=root, query=f"q-{n}")
        for version in range(1, 7):
            stream.commit()
            if version == 4:
                stream.snapshot(StoreId(0, 0))


def ids_of(catalog: Catalog, root: str) -> set[int]:
    with catalog.engine.connect() as connection:
        found = connection.execute(
            sa.select(stores.c.store_id).where(stores.c.checkpoint_root == root)
        )
        return set(found.scalars())


def parameters(catalog: Catalog) -> AbstractContextManager[list[dict[str, Any]]]:
    """The bound parameters of every statement the catalog runs meanwhile."""
    return executed(
        catalog.engine,
        lambda _conn, text, context: (
            {"statement": text} | (dict(context.compiled_parameters[0]) if context.compiled else {})
        ),
    )


def page_ids(values: dict[str, Any]) -> set[int]:
    """The store ids a statement's parameters name: an IN list's one parameter an id
    (SQLite), or one array (PostgreSQL: ``statements.among``)."""
    named = {k: v for k, v in values.items() if re.fullmatch(r"store_ids?(_\d+)*", k)}
    return {i for v in named.values() for i in (v if isinstance(v, list) else [v])}


PAGED: dict[str, Callable[[Catalog, str], list[list[Any]]]] = {
    "deletable_pages": lambda c, root: list(
        c.deletable_pages(POLICY, root=root, now=NOW, page_size=PAGE)
    ),
    "deletable_counts": lambda c, root: list(
        c.deletable_counts(POLICY, root=root, now=NOW, page_size=PAGE)
    ),
    "health_pages": lambda c, root: list(
        c.health_pages(POLICY, root=root, now=NOW, page_size=PAGE)
    ),
    "snapshot_candidate_pages": lambda c, root: list(
        c.snapshot_candidate_pages(1, root=root, page_size=PAGE)
    ),
    "store_pages": lambda c, root: list(c.store_pages(root, page_size=PAGE)),
}


def test_a_page_selects_its_own_stores_by_id(catalog: Catalog) -> None:
    """A root's page is not a range of store ids with the root as a filter: the first page of
    the last root would span every other root's stores, and its cost grow with the catalog
    (issue 35: 0.6 s a page at 2,000 stores, over 30 s at 20,000)."""
    fleet(catalog)
    last = ROOTS[-1]
    wanted = ids_of(catalog, last)
    for name, read in PAGED.items():
        with parameters(catalog) as seen:
            pages = read(catalog, last)
        assert pages, name
        # the page's ids are read by "after" and "size"; every other read names its ids
        reads = [p for p in seen if "read_stores" in p["statement"] and "size" not in p]
        assert reads, name
        named: set[int] = set()
        for values in reads:
            assert not {"after", "through", "root"} & set(values), (name, values)
            page = page_ids(values)
            assert page and len(page) <= PAGE and page <= wanted, (name, page, wanted)
            named |= page
        assert named == wanted, name


def test_the_pages_are_the_whole_answer(catalog: Catalog) -> None:
    fleet(catalog)
    for root in ROOTS:
        whole = catalog.deletable_files(POLICY, root=root, now=NOW)
        paged = [
            v
            for page in catalog.deletable_pages(POLICY, root=root, now=NOW, page_size=PAGE)
            for v in page
        ]
        assert whole
        assert sorted((v.file.path, v.verdict, v.reason) for v in paged) == sorted(
            (v.file.path, v.verdict, v.reason) for v in whole
        )
        counts = [
            c
            for page in catalog.deletable_counts(POLICY, root=root, now=NOW, page_size=PAGE)
            for c in page
        ]
        assert sum(c.files for c in counts) == len(whole)
        assert sum(c.size_bytes for c in counts) == sum(v.file.size_bytes for v in whole)
        health = [
            h
            for page in catalog.health_pages(POLICY, root=root, now=NOW, page_size=PAGE)
            for h, _ in page
        ]
        assert sorted(health, key=lambda h: str(h.key)) == sorted(
            catalog.store_health(POLICY, root=root, now=NOW), key=lambda h: str(h.key)
        )
