"""Writers that commit out of id order, on PostgreSQL: the catalog sensor reports each batch
and each run exactly once all the same.

PostgreSQL hands out a row's id at its INSERT and shows the row at its COMMIT: a transaction
holding a lower id can commit after a tick has read a higher one. Each test holds such a
transaction open on a real second connection, through the catalog's own SQL, while the
catalog records a newer row and the sensor ticks; then commits it and ticks again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from dagster import AssetKey, DagsterInstance

from state_runtime.catalog import BatchMetrics
from state_runtime.catalog.sql import batch_metrics, runs_and_leases
from state_runtime.identity import new_checkpoint_id
from state_runtime.maintenance import Fleet, snapshot_pass
from tests.catalog.settled import SETTLE
from tests.catalog.test_positions import writing_elsewhere
from tests.dagster.test_catalog_events import Tick, reported_batches, tick
from tests.dagster.test_dagster_definitions import FAST
from tests.maintenance.streams import StoreStream

POSTGRES = pytest.mark.parametrize(
    "catalog", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


def ticks_until(
    done: Callable[[], bool], stream: StoreStream, instance: DagsterInstance, cursor: str | None
) -> Tick:
    """Ticks from ``cursor`` until ``done`` holds (or ``SETTLE`` passed: the server's other
    writers may hold reporting back): the last tick."""
    deadline = time.monotonic() + SETTLE
    while True:
        last = tick(stream, instance, cursor)
        cursor = last.cursor
        if done() or time.monotonic() > deadline:
            return last
        time.sleep(0.2)


def figures(batch: int) -> BatchMetrics:
    return BatchMetrics(batch, 1, 5, 64, 1.5, 1, 0, {"batch_ms": 10.0})


@POSTGRES
def test_a_batch_committed_after_a_tick_read_a_newer_one_is_reported_once(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(1)
    catalog = stream.catalog
    with catalog.engine.connect() as slow, slow.begin():  # a driver's commit, held back
        batch_metrics.record_batch_metrics(
            slow, stream.root, "query-1", 0, figures(0), catalog.now()
        )
        catalog.record_batch_metrics(stream.root, "query-1", 1, figures(1))  # a newer id
        first = tick(stream, instance, None)  # reads while batch 0 is in flight
    again = ticks_until(
        lambda: len(reported_batches(stream, instance)) >= 2, stream, instance, first.cursor
    )
    assert sorted(reported_batches(stream, instance)) == [0, 1]
    assert tick(stream, instance, again.cursor).result.skip_reason is not None
    assert sorted(reported_batches(stream, instance)) == [0, 1]


@POSTGRES
def test_a_run_recorded_after_a_tick_read_a_newer_one_is_reported(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    catalog = stream.catalog
    first = tick(stream, instance, None)
    outside = Fleet(catalog, owner="ops-laptop:4242")
    with catalog.engine.connect() as slow, slow.begin():  # a run's start, held back
        held = runs_and_leases.start_run(
            slow, "snapshot", "ops-laptop:1", {}, new_checkpoint_id(), catalog.now()
        )
        newer = snapshot_pass(outside, FAST, only=[stream.key(stream.stores[0])])
        assert newer.run_id > held
        second = tick(stream, instance, first.cursor)  # reads while the older run is unseen
    catalog.finish_run(held, "succeeded", {"written": 0})
    snapshots = AssetKey("state_snapshots")

    def reported() -> list[int]:
        found = instance.fetch_materializations(snapshots, limit=10).records
        return sorted(
            r.asset_event.metadata["catalog_run_id"].value
            for r in found
            if r.asset_event is not None
        )

    ticks_until(lambda: len(reported()) >= 2, stream, instance, second.cursor)
    assert reported() == [held, newer.run_id]


@POSTGRES
def test_a_tick_held_back_by_an_open_writing_transaction_says_so(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Any writing transaction on the server, here in another database, holds the new rows
    back: a tick that finds nothing says how many wait, and for how long the oldest
    transaction has been open."""
    stream = make_stream()
    stream.run(1)
    first = ticks_until(lambda: True, stream, instance, None)
    quiet = ticks_until(lambda: True, stream, instance, first.cursor)
    with writing_elsewhere(stream.catalog):
        stream.catalog.record_batch_metrics(stream.root, "query-1", 0, figures(0))
        held = tick(stream, instance, quiet.cursor).result.skip_reason
    assert held is not None and held.skip_message is not None
    assert "1 newer rows wait" in held.skip_message and "open for" in held.skip_message
    ticks_until(lambda: reported_batches(stream, instance) == [0], stream, instance, quiet.cursor)
    assert reported_batches(stream, instance) == [0]
