"""Each public Catalog method is one retried transaction (a paged one, one per page of stores):
read from the code, and counted on a real engine for the driver's two calls per batch at
hundreds of stores and for a paged call."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyspark.sql.types import StringType, StructField, StructType

import state_runtime.catalog.api as api
from state_runtime.catalog import (
    BatchMetrics,
    Catalog,
    FileState,
    RetentionPolicy,
    RunKind,
    StoreKey,
)
from state_runtime.catalog.schema.tables import maintenance_runs
from state_runtime.errors import MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.maintenance import StoreNames
from state_runtime.maintenance.runs import recorded_run
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.query import StatefulQuery
from state_runtime.status import DEFAULT_LIMITS
from tests.catalog.factory import QUERY, ROOT, Stream

TTL = timedelta(minutes=5)
LEASE_BLOCK = {"store_lease"}
"""Context managers that hold something across a block: one transaction to take, one to
give back."""
TRANSACTIONS = ("_run", "_read", "_pages")
"""What runs one retried transaction (``_read`` a read through the reading views); ``_pages``
runs one per page of stores: a fleet-wide read (health, the cleanup plan) at 100,000 stores is
not one transaction by design, since its answer would not fit in memory, and each page is
consistent on its own (api/pages.py)."""


def _public_methods() -> Iterator[tuple[str, ast.FunctionDef]]:
    for path in sorted(Path(api.__file__).parent.glob("*.py")):
        # the engine and the retry policy, the paging loop
        if path.name in ("__init__.py", "transactions.py", "pages.py"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                        yield f"{path.stem}.{item.name}", item


def _self_calls(function: ast.FunctionDef) -> list[tuple[str, bool]]:
    """(name, inside a loop) of every ``self.<name>(...)`` call in the method."""
    found: list[tuple[str, bool]] = []

    def walk(node: ast.AST, looping: bool) -> None:
        for child in ast.iter_child_nodes(node):
            loop = looping or isinstance(child, ast.For | ast.While | ast.comprehension)
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and isinstance(child.func.value, ast.Name)
                and child.func.value.id == "self"
            ):
                found.append((child.func.attr, loop))
            walk(child, loop)

    walk(function, False)
    return found


def test_every_public_method_runs_one_transaction() -> None:
    methods = dict(_public_methods())
    assert len(methods) > 50
    for name, function in methods.items():
        calls = _self_calls(function)
        runs = [looping for called, looping in calls if called in TRANSACTIONS]
        others = {called for called, _ in calls if called not in (*TRANSACTIONS, "now")}
        if function.name in LEASE_BLOCK:
            assert runs == [False] and others == {"release_lease"}, name
            continue
        assert runs == [False], f"{name}: {len(runs)} transactions (in a loop: {any(runs)})"
        assert not others, f"{name} calls other catalog methods: {others}"


@contextmanager
def _transactions(catalog: Catalog) -> Iterator[list[str]]:
    begun: list[str] = []

    def count(connection: sa.engine.Connection) -> None:
        begun.append("begin")

    catalog.now()  # the database clock is measured outside (PostgreSQL, once per 5 minutes)
    sa.event.listen(catalog.engine, "begin", count)
    try:
        yield begun
    finally:
        sa.event.remove(catalog.engine, "begin", count)


@pytest.mark.parametrize("partitions", [4, 600])
def test_a_batch_is_two_transactions_at_any_partition_count(
    catalog: Catalog, partitions: int
) -> None:
    stores = [StoreId(0, p) for p in range(partitions)]
    stream = Stream(catalog, stores)
    stream.commit()
    operators = [(0, "default", partitions)]
    with _transactions(catalog) as begun:
        start = catalog.begin_batch(ROOT, QUERY, 1, "run1", operators)
        infos = [stream.delta(s) for s in stores]
        duplicates = [stream.delta(s) for s in stores[:3]]
        catalog.commit_batch(
            ROOT,
            QUERY,
            1,
            infos,
            run="run1",
            duplicates=duplicates,
            holders={s: f"host:{s.partition_id % 2}" for s in stores},
            suspects=[d.store for d in duplicates],
            metrics=BatchMetrics(10, 10, 10, 10, 0.0, 1, 0),
        )
    assert len(begun) == 2
    assert start.last_batch == 0 and len(start.previous) == partitions
    files = catalog.known_paths(ROOT)
    assert sum(1 for s in files.values() if s == FileState.COMMITTED) == 2 * partitions
    assert [files[d.path] for d in duplicates] == [FileState.ORPHAN] * 3
    assert len(catalog.store_holders(ROOT)) == partitions
    [metrics] = [m for m in catalog.batch_metrics(ROOT, QUERY) if m.batch_id == 1]
    assert metrics.metrics.commit_ms > 0
    [sweep] = catalog.attempt_sweeps(catalog.now() + timedelta(seconds=1))
    assert sweep.committed and sweep.targets == {d.store: 2 for d in duplicates}


@pytest.mark.parametrize("count", [2, 300])
def test_a_run_over_known_stores_is_two_transactions_at_any_store_count(
    catalog: Catalog, count: int
) -> None:
    """A maintenance run that knows its stores (a restore): one transaction closes an
    abandoned run, starts this one and takes its leases; one closes it, gives them back and
    records its stores' status changes (five before: the sweep, the start, the leases'
    taking and giving back, the close)."""
    ids = [StoreId(0, p) for p in range(count)]
    Stream(catalog, ids).commit()
    dead = catalog.start_run("validate", "silent")
    old = catalog.now() - timedelta(hours=1)
    with catalog.engine.begin() as connection:  # silent for an hour: abandoned
        connection.execute(
            sa.update(maintenance_runs)
            .where(maintenance_runs.c.run_id == dead)
            .values(started_at=old, heartbeat_at=old)
        )
    keys = [StoreKey(ROOT, store) for store in ids]
    with (
        _transactions(catalog) as begun,
        recorded_run(
            catalog, RunKind.RESTORE, "me", {}, DEFAULT_LIMITS, leases=keys, lease_ttl=TTL
        ) as run,
    ):
        assert run.held is not None and len(run.held.leases) == count and not run.busy
        held = len(begun)
    assert (held, len(begun)) == (1, 2)
    abandoned, done = catalog.run(dead), catalog.run(run.run_id)
    assert abandoned is not None and abandoned.outcome == "abandoned"
    assert done is not None and done.outcome == "succeeded"
    assert all(catalog.try_acquire_lease(key, "next", TTL) for key in keys[:3])


@pytest.mark.parametrize("operators", [1, 3])
def test_a_query_start_is_two_transactions_at_any_operator_count(
    catalog: Catalog, tmp_path: Path, operators: int
) -> None:
    """A driver's start reads what it plans against (schema histories, stores, layouts) in
    one transaction and records its stores, first layouts and schema histories in one (four
    reads and three writes an operator before), all of it as separate calls would."""
    ops = [
        StatefulOperator(
            operator_id=n,
            key_columns=("k",),
            key_schema="k string",
            value_schema="total bigint",
            output_schema="k string, total bigint",
            update=lambda store, rows: [],
            num_partitions=4,
        )
        for n in range(operators)
    ]
    url = catalog.engine.url.render_as_string(hide_password=False)
    query = StatefulQuery(QUERY, str(tmp_path / "root"), ops, catalog_url=url)
    with _transactions(query.catalog) as begun:
        query._register(0, StructType([StructField("k", StringType())]))
    assert len(begun) == 2
    assert {r.key.store for r in catalog.stores(query.root)} == {
        StoreId(n, p) for n in range(operators) for p in range(4)
    }
    layouts = catalog.layouts(query.root)
    histories = catalog.schema_histories(query.root)
    assert set(layouts) == set(histories) == {(n, "default") for n in range(operators)}
    assert all(layout.num_partitions == 4 for layout in layouts.values())


def test_a_refused_lease_is_one_transaction(catalog: Catalog) -> None:
    Stream(catalog, [StoreId(0, 0)]).commit()
    key = StoreKey(ROOT, StoreId(0, 0))
    with catalog.store_lease(key, "first", timedelta(minutes=5)):
        with (
            _transactions(catalog) as begun,
            pytest.raises(MaintenanceRefused, match="first"),
            catalog.store_lease(key, "second", timedelta(minutes=5)),
        ):
            pass
        assert len(begun) == 1


def test_a_paged_read_is_one_transaction_per_page(catalog: Catalog) -> None:
    """Health of 25 stores, 10 a page: 3 pages, 3 transactions (a page shorter than the page
    size is the last: no empty read ends the loop); a fleet smaller than a page is one
    transaction; one the size of whole pages ends with the empty read."""
    stream = Stream(catalog, [StoreId(0, p) for p in range(25)])
    stream.commit()
    with _transactions(catalog) as begun:
        pages = list(catalog.health_pages(RetentionPolicy(), page_size=10))
    assert [len(page) for page in pages] == [10, 10, 5]
    assert len(begun) == 3
    assert [h.key.store.partition_id for page in pages for h, _ in page] == list(range(25))
    for size, transactions in ((30, 1), (25, 2)):
        with _transactions(catalog) as begun:
            pages = list(catalog.health_pages(RetentionPolicy(), page_size=size))
        assert [len(page) for page in pages] == [25]
        assert len(begun) == transactions, size


def test_the_stores_names_are_one_read_whatever_the_roots(catalog: Catalog) -> None:
    """``StoreNames.of`` (every Dagster pass, and each catalog-events tick that reports a
    batch) reads every root's queries in one transaction: one a root took about a minute at
    100,000 stores' 500 roots under load (docs/maintenance.md). A root whose stores never
    committed has no query."""
    for n, query in enumerate(["clicks", "views", "clicks"]):
        Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/q{n}", query=query).commit()
    catalog.register_stores(f"{ROOT}/idle", [StoreId(0, 0)], "k bigint", "v bigint")
    with _transactions(catalog) as begun:
        names = StoreNames.of(catalog)
    assert len(begun) == 1
    assert catalog.root_queries() == {
        f"{ROOT}/idle": [],
        f"{ROOT}/q0": ["clicks"],
        f"{ROOT}/q1": ["views"],
        f"{ROOT}/q2": ["clicks"],
    }
    assert names.labels[f"{ROOT}/q1"] == "views"
