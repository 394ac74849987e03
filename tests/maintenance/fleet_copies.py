"""A large fleet for memory tests, built in seconds: one query's stores recorded through the
catalog's own calls (:class:`tests.catalog.factory.Stream`), then copied to the other roots
(:func:`benchmarks.fleet.copy_roots`: committing 20,000 stores batch by batch through
``commit_batch`` takes minutes, copying a query a fraction of a second). Each query is as the
runtime would have recorded it: 200 stores, three committed versions (every file present,
empty, and recorded verified, as the last validation left it) and two deletable orphans a
store."""

from __future__ import annotations

from pathlib import Path

from benchmarks.fleet import copy_roots
from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from tests.catalog.factory import Stream

PARTITIONS = 200


def _query(catalog: Catalog, root: Path) -> None:
    """One query's stores, written through the catalog's calls, and their committed files
    (empty: each recorded with size 0)."""
    stream = Stream(
        catalog,
        [StoreId(0, p) for p in range(PARTITIONS)],
        root=LocalStorage(root).uri,
        writers_behind=None,
    )
    for _ in range(2):
        stream.record([stream.delta(s, size=0) for s in stream.stores])  # an attempt that lost
        stream.commit(size=0)
    stream.commit(size=0)
    paths = [i.path for chain in stream.committed.values() for i in chain]
    catalog.record_verifications(stream.root, dict.fromkeys(paths))
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()


def fleet_of(catalog: Catalog, folder: Path, queries: int) -> list[str]:
    """``queries`` queries of :data:`PARTITIONS` stores each, one root each below ``folder``;
    their roots as the catalog records them, in order."""
    folders = [folder / f"query-{query:05d}" for query in range(queries)]
    _query(catalog, folders[0])
    copy_roots(catalog, folders[0], folders[1:])
    return [LocalStorage(root).uri for root in folders]
