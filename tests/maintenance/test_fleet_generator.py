"""The fleet benchmark's generator (``benchmarks/fleet.py``) builds what the catalog's views
see: every store of every query, at the expected version, with its staggered snapshot, on
real PostgreSQL; new batches raise every store's version and make due the stores whose chain
passed the threshold. Query 0 is written through the runtime's calls and query 1 copied from
it (history and new batches alike): every file of both verifies, and each query commits under
its own query id, so each root is labelled by its own query, as in a real fleet (a copy once
kept query 0's id: every root's label was ``query-00000@<its folder>``). A backlog's bulk copy
(``copy_roots``) gives each root the template's files, linked, and its own records; on an
error it raises only when no link is running, and links no more roots."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.fleet import (
    LinkFailed,
    Shape,
    advance,
    build,
    copy_roots,
    query_id,
    query_storage,
)
from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    StoreNames,
    due_for_snapshot,
    store_reports,
    validate_stores,
)
from state_runtime.storage import LocalStorage

SHAPE = Shape(queries=2, partitions=4, versions=12, snapshot_every=10)
POLICY = MaintenancePolicy(snapshot_min_deltas=7)


def last_snapshot(partition: int, latest: int) -> int:
    """The generator's phase: a snapshot at each version v with (v + partition) % 10 == 0."""
    return max(v for v in range(1, latest + 1) if (v + partition) % SHAPE.snapshot_every == 0)


def own_queries(catalog: Catalog, folder: Path) -> None:
    """Each query's root has its commits under its own query id, and is labelled by it."""
    queries = {query_storage(folder, q).uri: query_id(q) for q in range(SHAPE.queries)}
    assert catalog.root_queries() == {root: [query] for root, query in queries.items()}
    assert StoreNames.of(catalog).labels == queries


def test_the_generator_builds_a_fleet_the_catalog_views_see(
    pg_catalog: Catalog, tmp_path: Path
) -> None:
    url = pg_catalog.engine.url.render_as_string(hide_password=False)
    assert build(url, tmp_path, SHAPE) > 0
    fleet = Fleet(pg_catalog, owner="tests")
    roots = {query_storage(tmp_path, q).uri for q in range(SHAPE.queries)}
    expected = {(root, StoreId(0, p)) for root in roots for p in range(SHAPE.partitions)}

    reports = store_reports(fleet, POLICY)
    assert {(r.key.root, r.key.store) for r in reports} == expected
    for report in reports:
        partition = report.key.store.partition_id
        assert report.health.latest.version == SHAPE.versions, report.key
        assert report.health.last_snapshot_version == last_snapshot(partition, 12), report.key
    # 12 - last snapshot deltas: 2, 3, 4, 5 for partitions 0..3; none reaches 7
    assert due_for_snapshot(fleet, POLICY) == []
    own_queries(pg_catalog, tmp_path)

    advance(url, tmp_path, SHAPE, batches=3)
    reports = store_reports(fleet, POLICY)
    assert {r.health.latest.version for r in reports} == {15}
    assert {r.health.last_snapshot_version for r in reports if r.key.store.partition_id == 3} == {7}
    # now 5, 6, 7, 8 deltas: partitions 2 and 3 of each query are due
    due = {
        (d.record.key.root, d.record.key.store.partition_id)
        for d in due_for_snapshot(fleet, POLICY)
    }
    assert due == {(root, p) for root in roots for p in (2, 3)}
    full = validate_stores(fleet, replace(POLICY, verify_sample_percent=100))
    assert full.ok and full.stores == SHAPE.stores and full.new == 3 * SHAPE.stores, full.errors
    own_queries(pg_catalog, tmp_path)


def test_copy_roots_links_each_roots_files_and_copies_its_records(
    sqlite_catalog_url: str, tmp_path: Path
) -> None:
    catalog = Catalog.open(sqlite_catalog_url, upgrade=True)
    url = catalog.engine.url.render_as_string(hide_password=False)
    small = replace(SHAPE, queries=1)
    build(url, tmp_path, small)
    template = tmp_path / query_id(0)
    roots = [tmp_path / query_id(q) for q in (1, 2, 3)]
    copy_roots(catalog, template, roots)

    def files(folder: Path) -> dict[str, int]:
        return {str(p.relative_to(folder)): p.stat().st_ino for p in folder.rglob("*.*")}

    linked = files(template)
    assert len(linked) > small.stores * small.versions
    wanted = {
        s.key.store: sorted(f.path for f in catalog.store_files(s.key.root, s.key.store))
        for s in catalog.stores(LocalStorage(template).uri)
    }
    for root in roots:
        assert files(root) == linked, root  # the same files, hard-linked
        uri = LocalStorage(root).uri
        copied = {
            s.key.store: sorted(f.path for f in catalog.store_files(uri, s.key.store))
            for s in catalog.stores(uri)
        }
        assert copied == wanted, root
    assert catalog.root_queries()[LocalStorage(roots[2]).uri] == [query_id(3)]
    catalog.close()


def _template(catalog: Catalog, folder: Path) -> Path:
    """Query 0 of a one-query fleet built below ``folder``: its root."""
    build(
        catalog.engine.url.render_as_string(hide_password=False), folder, replace(SHAPE, queries=1)
    )
    return folder / query_id(0)


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")}


def test_a_root_that_cannot_be_linked_is_named_once_no_link_runs(
    sqlite_catalog_url: str, tmp_path: Path
) -> None:
    """A root below a regular file (its folder cannot be made) among roots that can be
    linked: :class:`LinkFailed` names it, raised when every link thread has ended."""
    catalog = Catalog.open(sqlite_catalog_url, upgrade=True)
    template = _template(catalog, tmp_path)
    (tmp_path / "a-file").touch()
    before = _pool_threads()
    roots = [tmp_path / query_id(1), tmp_path / "a-file" / query_id(2), tmp_path / query_id(3)]
    with pytest.raises(LinkFailed, match=f"not linked at {roots[1]}: .*Not a directory"):
        copy_roots(catalog, template, roots)
    assert _pool_threads() <= before  # the link threads ended
    catalog.close()


def test_a_failed_record_copy_links_no_more_roots(sqlite_catalog_url: str, tmp_path: Path) -> None:
    """A root copied twice: its records' second copy fails at once (the catalog's unique
    stores); the links not yet started are cancelled, the running ones ended, before it is
    raised (the copy once went on linking every root first)."""
    catalog = Catalog.open(sqlite_catalog_url, upgrade=True)
    template = _template(catalog, tmp_path)
    copy_roots(catalog, template, [tmp_path / query_id(1)])
    others = [tmp_path / query_id(q) for q in range(2, 80)]
    before = _pool_threads()
    with pytest.raises(sa.exc.IntegrityError):
        copy_roots(catalog, template, [tmp_path / query_id(1), *others])
    assert _pool_threads() <= before  # the link threads ended
    assert sum(root.exists() for root in others) < len(others) // 2
    catalog.close()
