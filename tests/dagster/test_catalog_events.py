"""Maintenance run outside Dagster reaches Dagster: the catalog sensor's events, in process.

The sensor reads real runs recorded by the library (as the CLI records them) in a real
catalog; each tick's events are reported to the instance the way the daemon reports them
(the runs it requests executed; the batches it reports itself, each at the time the runtime
recorded it), and the instance then shows the stores' truth.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    EventLogRecord,
    SensorResult,
    build_sensor_context,
)

from dagster_project.defs import catalog_events
from dagster_project.defs.catalog_events import Cursor, catalog_events_sensor, catalog_report_job
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.store_events import HEALTH_KEY
from state_runtime.catalog import BatchMetrics, Position, StoreKey
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, StoreNames, run_checks, snapshot_pass
from state_runtime.maintenance.store_names import distinct_tails, root_labels
from tests.catalog.settled import settled
from tests.dagster.conftest import BOTH_CATALOGS, latest_states, resources_for, store_name
from tests.dagster.test_dagster_definitions import FAST
from tests.maintenance.streams import StoreStream

Event = AssetMaterialization | AssetCheckEvaluation
BATCH_KEY = AssetKey("state_batch_metrics")


@dataclass
class Tick:
    """A sensor tick, as the daemon carries it out: its runless events reported, the run it
    requests executed; ``events`` holds both."""

    result: SensorResult
    events: list[Event]

    @property
    def cursor(self) -> str | None:
        return self.result.cursor


def batch_records(instance: DagsterInstance) -> list[EventLogRecord]:
    """The batch metrics' materializations reported so far, oldest first."""
    found = instance.fetch_materializations(BATCH_KEY, limit=1000, ascending=True)
    return list(found.records)


def tick(stream: StoreStream, instance: DagsterInstance, cursor: str | None) -> Tick:
    resources = resources_for(stream.catalog, FAST)
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    before = len(batch_records(instance))
    result = catalog_events_sensor(context)  # reports the batches itself, each at its time
    assert not result.asset_events
    events: list[Event] = []
    for record in batch_records(instance)[before:]:
        assert isinstance(record.asset_event, AssetMaterialization)
        events.append(record.asset_event)
    for request in result.run_requests:
        run = catalog_report_job.execute_in_process(
            run_config=request.run_config, instance=instance, resources=resources
        )
        assert run.success
        events += [e.materialization for e in run.get_asset_materialization_events()]
        events += run.get_asset_check_evaluations()
    return Tick(result, events)


def checks(events: Sequence[Event], name: str) -> dict[str | None, AssetCheckEvaluation]:
    return {
        e.partition: e
        for e in events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == name
    }


def latest_status(instance: DagsterInstance) -> dict[str, str]:
    return {p: state["status"] for p, state in latest_states(instance).items()}


def test_runs_outside_dagster_become_the_same_asset_events(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    names = {s: store_name(stream, s) for s in stream.stores}
    assert set(names.values()) == {"query-1/0/0/default", "query-1/0/1/default"} | {
        "query-1/1/0/sessions"
    }
    instance.add_dynamic_partitions("state_stores", list(names.values()))
    for batch in range(3):
        figures = BatchMetrics(100 + batch, 10, 50, 4096, 12.5, 2, 1, {"batch_ms": 250.0})
        stream.catalog.record_batch_metrics(stream.root, "query-1", batch, figures)

    # Before anything ran: every store is unknown, a warning on its partition, never green.
    first = tick(stream, instance, None)
    assert Cursor.parse(first.cursor).run == Position()
    status = checks(first.events, "store_status")
    assert set(status) == set(names.values())
    assert all(not e.passed and e.severity.value == "WARN" for e in status.values())
    assert set(latest_status(instance).values()) == {"unknown"}
    # few batches: an event each, its figures to plot
    batches = [e for e in first.events if e.asset_key == BATCH_KEY]
    assert [b.metadata["batch"].value for b in batches] == [0, 1, 2]
    assert [b.metadata["batches"].value for b in batches] == [1, 1, 1]
    # each batch at the time the runtime recorded it (the Plots tab's x), not at the tick
    recorded = [
        m.recorded_at.timestamp() for _, m in stream.catalog.batch_metrics_after(Position())
    ]
    assert [r.timestamp for r in batch_records(instance)] == pytest.approx(recorded, abs=1e-3)
    assert recorded == sorted(set(recorded))  # one point per batch, in commit order
    # and said to the second, where the plots' axis shows minutes
    committed = [b.metadata["committed_at"].value for b in batches]
    assert committed == pytest.approx(recorded, abs=1e-3)
    assert batches[2].metadata["query-1/rows_in"].value == 102
    assert batches[2].metadata["catalog_metrics_id"].value == recorded_ids(stream)[2].row
    assert batches[2].metadata["query-1/batch_ms"].value == 250.0
    assert batches[2].metadata["query-1/cache_hit_rate"].value == 0.667

    # The CLI's validation (the library, recorded as a 'validate' run) finds a lost file.
    broken = stream.stores[1]
    lost = stream.committed[broken][4]
    (stream.storage.root / lost.path).unlink()
    cli = Fleet(stream.catalog, owner="ops-laptop:4242")
    report = run_checks(cli, FAST)
    second = tick(stream, instance, first.cursor)
    lineage = checks(second.events, "lineage_valid")[None]
    assert not lineage.passed and lineage.severity.value == "ERROR" and lineage.blocking
    assert f"validate run {report.run_id} by ops-laptop:4242" in (lineage.description or "")
    assert lost.path in (lineage.description or "")
    assert lineage.metadata["failing_stores"].value == [str(stream.key(broken))]
    assert latest_status(instance) == {
        name: "broken" if store == broken else "healthy" for store, name in names.items()
    }
    status_events = [
        e
        for e in second.events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == "store_status"
    ]
    assert status_events[-1].partition == names[broken]  # the worst store is the check's latest
    key = AssetCheckKey(state_checkpoints.key, "store_status")
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert latest.event is not None and latest.event.asset_check_evaluation is not None
    assert latest.event.asset_check_evaluation.partition == names[broken]
    [fleet] = [e for e in second.events if e.asset_key == HEALTH_KEY]
    assert fleet.metadata["broken_stores"].value == 1 and fleet.metadata["stores"].value == 3
    assert fleet.metadata["live_size"].value.endswith(("KB", "B"))

    # A snapshot pass from outside: a materialization of state_snapshots; a run that Dagster
    # started is not reported twice; nothing new, nothing reported.
    snapshots = snapshot_pass(cli, FAST, only=[stream.key(stream.stores[0])])
    snapshot_pass(Fleet(stream.catalog, owner="dagster:0123"), FAST)
    third = tick(stream, instance, second.cursor)
    [snap] = [e for e in third.events if e.asset_key == AssetKey("state_snapshots")]
    assert snap.metadata["catalog_run_id"].value == snapshots.run_id
    assert snap.metadata["written"].value == 1
    assert snap.metadata["run_by"].value == "ops-laptop:4242"
    after = Cursor.parse(third.cursor).run  # past the run Dagster started
    assert after is not None and after.row == snapshots.run_id + 1
    quiet = tick(stream, instance, third.cursor)
    assert not quiet.events and quiet.result.skip_reason is not None
    assert quiet.cursor == third.cursor


def recorded_ids(stream: StoreStream) -> list[Position]:
    return [at for at, _ in stream.catalog.batch_metrics_after(Position(), limit=10_000)]


class RefusingStorage:
    """The instance's event log refusing its ``fail_at``-th write from now on (that one only):
    a real failure inside the storage, as a full disk or a dropped connection raises it."""

    def __init__(self, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch, fail_at: int):
        storage = instance.event_log_storage
        self.store = storage.store_event
        self.written = 0
        self.fail_at = fail_at
        monkeypatch.setattr(storage, "store_event", self.store_event)

    def store_event(self, event: Any) -> None:
        self.written += 1
        if self.written == self.fail_at:
            raise OSError("event log refused the write")
        self.store(event)


def reported_batches(stream: StoreStream, instance: DagsterInstance) -> list[int]:
    """The batches Dagster holds, from each event's table, in the order they were written;
    each event stamped with its newest batch's commit."""
    batches = stream.catalog.batch_metrics_after(Position(), limit=10_000)
    recorded = {m.batch_id: m.recorded_at.timestamp() for _, m in batches}
    found = []
    for record in batch_records(instance):
        assert record.asset_event is not None
        metadata = record.asset_event.metadata
        table = metadata["batch_figures"].value if "batch_figures" in metadata else None
        rows = [row["batch"] for row in table] if table else [metadata["batch"].value]
        assert record.timestamp == pytest.approx(recorded[rows[-1]], abs=1e-3)
        found += rows
    return found


@BOTH_CATALOGS
def test_each_batch_is_reported_exactly_once_after_a_tick_failed_partway(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick that fails partway is continued by the next one from the newest batch Dagster
    holds, never repeated (its cursor was not saved), in pages and runs of batches, at most a
    tick's bound per tick; each event at the time the runtime recorded its newest batch."""
    monkeypatch.setattr(catalog_events, "PAGE", 7)
    monkeypatch.setattr(catalog_events, "EVENTS", 3)  # 7 batches: runs of 3, 3 and 1
    monkeypatch.setattr(catalog_events, "TICK_BATCHES", 20)
    stream = make_stream()
    stream.run(1)
    for batch in range(30):  # three queries in turn, each batch number its own
        figures = BatchMetrics(batch, 1, 5, 64, 1.5, 1, 0, {"batch_ms": 10.0})
        stream.catalog.record_batch_metrics(stream.root, f"query-{batch % 3}", batch, figures)
    settled(lambda: recorded_ids(stream), 30)  # PostgreSQL: once older writers ended
    first = tick(stream, instance, None)
    assert sorted(reported_batches(stream, instance)) == list(range(20))  # the tick's bound
    assert len(batch_records(instance)) == 9  # three pages, three runs each
    refusing = RefusingStorage(instance, monkeypatch, fail_at=2)
    with pytest.raises(OSError, match="refused"):
        tick(stream, instance, first.cursor)  # one run's event, then the failure
    assert refusing.written == 2 and len(batch_records(instance)) == 10
    again = tick(stream, instance, first.cursor)
    assert Cursor.parse(again.cursor).metrics == recorded_ids(stream)[-1]
    assert sorted(reported_batches(stream, instance)) == list(range(30))  # each once
    quiet = tick(stream, instance, again.cursor)
    assert quiet.result.skip_reason is not None and len(reported_batches(stream, instance)) == 30


def test_a_tick_of_many_batches_writes_a_bounded_number_of_events(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``EVENTS`` batches a page, an event reports a run of consecutive batches: each
    query's newest batch in it to plot, each batch's figures in its table."""
    monkeypatch.setattr(catalog_events, "EVENTS", 4)
    stream = make_stream()
    stream.run(1)
    other = "file:///elsewhere/checkpoint"  # a second query, in turn with the first
    for batch in range(30):
        figures = BatchMetrics(batch, 1, 5, 64, 1.5, 1, 0, {"batch_ms": 10.0})
        root, query = (stream.root, "query-1") if batch % 2 == 0 else (other, "query-2")
        stream.catalog.record_batch_metrics(root, query, batch, figures)
    tick(stream, instance, None)
    events = [r.asset_event for r in batch_records(instance) if r.asset_event is not None]
    assert [e.metadata["batch"].value for e in events] == [7, 15, 23, 29]
    assert [e.metadata["batches"].value for e in events] == [8, 8, 8, 6]
    # each query's newest batch in the run, on its own charts
    assert [e.metadata["query-1/rows_in"].value for e in events] == [6, 14, 22, 28]
    assert [e.metadata["query-2/rows_in"].value for e in events] == [7, 15, 23, 29]
    table = events[0].metadata["batch_figures"].value
    assert [row["query"] for row in table] == ["query-1", "query-2"] * 4
    assert [row["rows_in"] for row in table] == list(range(8))
    assert reported_batches(stream, instance) == list(range(30))


def test_root_labels_are_the_query_or_the_shortest_telling_tail() -> None:
    one = {"file:///data/a/checkpoint": ["clicks"], "s3://b/x/checkpoint": ["views"]}
    assert root_labels(one) == {
        "file:///data/a/checkpoint": "clicks",
        "s3://b/x/checkpoint": "views",
    }
    moved = {"file:///d/runs/1/checkpoint": ["clicks"], "file:///d/runs/2/checkpoint": ["clicks"]}
    assert root_labels(moved) == {
        "file:///d/runs/1/checkpoint": "clicks@1/checkpoint",
        "file:///d/runs/2/checkpoint": "clicks@2/checkpoint",
    }
    shared = {"file:///d/shared": ["a", "b"], "file:///e/empty": []}
    assert root_labels(shared) == {"file:///d/shared": "shared", "file:///e/empty": "empty"}
    assert distinct_tails(["s3://b/p/ckpt", "file:///q/p/ckpt"]) == {
        "s3://b/p/ckpt": "b/p/ckpt",
        "file:///q/p/ckpt": "q/p/ckpt",
    }


def test_the_labels_of_500_roots_of_one_query_take_well_under_a_second() -> None:
    """A query seen below 500 roots (a fleet's copies; a query moved many times): each root's
    tail was found by comparing it with every other root, once per root, 125 million
    comparisons (227 s of CPU in a profile of ``StoreNames.of`` at 100,000 stores)."""
    roots = {f"file:///fleet/query-{n:05d}/checkpoint": ["clicks"] for n in range(500)}
    started = time.process_time()
    labels = root_labels(roots)
    assert time.process_time() - started < 1.0
    assert labels["file:///fleet/query-00007/checkpoint"] == "clicks@query-00007/checkpoint"
    assert len(set(labels.values())) == 500


def test_a_store_name_leads_back_to_its_store() -> None:
    names = StoreNames(root_labels({"file:///d/runs/1/ckpt": ["clicks"], "s3://b/v": ["views"]}))
    key = StoreKey("file:///d/runs/1/ckpt", StoreId(2, 7, "default"))
    assert names.name(key) == "clicks/2/7/default"
    assert names.key("clicks/2/7/default") == key == names.key(str(key))
    with pytest.raises(InvalidArgument, match="labels: clicks, views"):
        names.key("nope/2/7/default")


def test_a_cursor_and_a_queued_run_from_before_positions_still_work(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Code before commit positions saved a cursor of ids and no partitions, and requested
    report runs whose config names ids: both read as positions at transaction 0."""
    stream = make_stream()
    stream.run(6)
    outside = Fleet(stream.catalog, owner="ops-laptop:4242")
    done = snapshot_pass(outside, FAST, only=[stream.key(stream.stores[0])])
    old = Cursor.parse('{"run": 0, "metrics": 0}')
    assert (old.run, old.metrics, old.partitions) == (Position(), Position(), "")
    resources = resources_for(stream.catalog, FAST)
    queued = {"ops": {"report_catalog_runs": {"config": {"after": 0, "until": 10**9}}}}
    run = catalog_report_job.execute_in_process(
        run_config=queued, instance=instance, resources=resources
    )
    assert run.success
    reported = [e.materialization for e in run.get_asset_materialization_events()]
    assert [
        m.metadata["catalog_run_id"].value
        for m in reported
        if m.asset_key == AssetKey("state_snapshots")
    ] == [done.run_id]
