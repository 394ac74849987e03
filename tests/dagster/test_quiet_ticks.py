"""A sensor tick with nothing new reads no more than what changed: the statements each sensor
sends the catalog on a quiet tick, and the rows they return, counted on a real catalog with a
broken store (an open problem) and every sensor's cursor current."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import sqlalchemy as sa
from dagster import DagsterInstance, SensorResult, build_sensor_context
from sqlalchemy.engine import Connection

from dagster_project.defs.sensors import store_discovery_sensor
from state_runtime.catalog import BatchMetrics
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, run_checks
from tests.dagster.conftest import resources_for
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.dagster.test_store_failures import FailureSensor, break_store
from tests.maintenance.streams import StoreStream
from tests.statements import executed


def reads_of(database: str) -> AbstractContextManager[list[str]]:
    """The reading statements a sensor's tick sends the catalog in ``database`` (the schema
    revision check every opening makes left out), collected while the block runs."""

    def keep(conn: Connection, statement: str, _context: object) -> str | None:
        text = " ".join(statement.split())
        reads = text.startswith(("SELECT", "WITH")) and "schema_revision" not in text
        return text if reads and conn.engine.url.database == database else None

    return executed(sa.engine.Engine, keep)


def reading(statements: list[str]) -> list[str]:
    """What each statement reads: its first reading view, and whether it only counts."""
    found = []
    for text in statements:
        view = text.split(" FROM ", 1)[1].split()[0]
        found.append(f"{view} (aggregate)" if "count(*)" in text else view)
    return found


def test_a_quiet_tick_reads_what_changed_not_the_fleet(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """With every cursor current and one store broken, a quiet tick of each sensor sends the
    catalog one statement per thing it follows (what the stores' names follow, the open
    problems, the runs and the batches after its cursor), none listing the stores or their
    commits."""
    stream = make_stream()
    stream.run(6)
    break_store(stream)
    run_checks(Fleet(stream.catalog, owner="tests"), FAST)  # one broken store: an open problem
    resources = resources_for(stream.catalog, FAST)
    database = stream.catalog.engine.url.database or ""

    def discovery(cursor: str | None) -> SensorResult:
        context = build_sensor_context(instance=instance, resources=resources, cursor=cursor)
        found = store_discovery_sensor(context)
        for request in found.dynamic_partitions_requests:
            instance.add_dynamic_partitions("state_stores", list(request.partition_keys))
        return found

    first = discovery(None)
    failures = FailureSensor(stream, instance)
    assert len(failures.fail_broken()) == 1
    assert failures.tick() == ([], [])  # the partition shows Failed: the problems settled
    reported = tick(stream, instance, None)
    with reads_of(database) as statements:
        assert discovery(first.cursor).skip_reason is not None
    # the names' mark: the stores' count, the roots by index probes, the (root, query) pairs'
    # count (one row a pair; the commit log not read)
    assert reading(statements) == [
        "read_stores (aggregate)",
        "read_stores",
        "read_root_queries (aggregate)",
    ]
    with reads_of(database) as statements:
        assert failures.tick() == ([], [])
    assert reading(statements) == ["read_store_problems (aggregate)"]
    with reads_of(database) as statements:
        quiet = tick(stream, instance, reported.cursor)
    assert not quiet.result.run_requests and not quiet.events
    assert reading(statements) == ["read_maintenance_runs", "read_batch_metrics"]
    # a partition added (a new store's): the next tick reports the stores' state again
    instance.add_dynamic_partitions("state_stores", ["query-2/0/0/default"])
    assert tick(stream, instance, quiet.cursor).result.run_requests


def test_ticks_with_batches_read_the_stores_names_again_only_once_a_store_is_added(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Each tick that reports batches names their queries; it reads every root's queries (a
    read of every (root, query) pair; a scan of the commit log before, 1.6 to 2.0 s at 100,000
    stores) only when a store was added (or a root relocated, a query renamed:
    ``tests/catalog/test_names_mark.py``), not every tick."""
    stream = make_stream()
    stream.run(2)
    database = stream.catalog.engine.url.database or ""
    cursor = tick(stream, instance, None).cursor
    scans = []
    for batch in range(100, 104):
        if batch == 102:
            stream.catalog.register_stores("file:///elsewhere/q", [StoreId(0, 0)], "k", "v")
        figures = BatchMetrics(batch, 1, 5, 64, 1.5, 1, 0, {"batch_ms": 10.0})
        stream.catalog.record_batch_metrics(stream.root, stream.query, batch, figures)
        with reads_of(database) as statements:
            reported = tick(stream, instance, cursor)
        assert [e.metadata["batch"].value for e in reported.events[:1]] == [batch]
        cursor = reported.cursor
        scans.append(sum("read_root_queries" in s and "count(" not in s for s in statements))
    assert scans[1:] == [0, 1, 0], scans
