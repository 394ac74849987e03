"""Status changes are recorded for what a run or a read touched, once: a run's close records
its own stores, a health read records the stores it read from the facts it read (no second
read of them), and a validation records each store once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime.status import StoreStatus
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on
from tests.statements import executed

A, B, C = StoreId(0, 0), StoreId(0, 1), StoreId(0, 2)
POLICY = MaintenancePolicy(snapshot_min_deltas=1)


def recorded(catalog: Catalog) -> dict[StoreId, str | None]:
    return {h.key.store: h.recorded_status for h in catalog.store_health(RetentionPolicy())}


def status_writes(catalog: Catalog) -> AbstractContextManager[list[str]]:
    """The statements that write ``store_status_changes`` while the block runs."""
    return executed(
        catalog.engine,
        lambda _conn, text, _context: (
            text if "INSERT INTO STORE_STATUS_CHANGES" in text.upper() else None
        ),
    )


def test_a_run_records_the_status_of_its_stores_only(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[A, B, C])
    stream.run(3)
    assert set(recorded(stream.catalog).values()) == {None}
    with status_writes(stream.catalog) as writes:
        report = snapshot_pass(fleet_on(stream), POLICY, only=[stream.key(A)])
    assert report.count(report.outcomes[0].status) == 1
    assert recorded(stream.catalog) == {A: StoreStatus.UNKNOWN.value, B: None, C: None}
    assert len(writes) == 1  # the close's one statement, over the run's stores


def test_a_health_read_records_what_it_read_once(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[A, B, C])
    stream.run(3)
    fleet = fleet_on(stream)
    with status_writes(stream.catalog) as writes:
        [report] = store_reports(fleet, POLICY, only=[stream.key(B)])
    assert report.status.status is StoreStatus.UNKNOWN and report.status.recorded
    assert recorded(stream.catalog) == {A: None, B: StoreStatus.UNKNOWN.value, C: None}
    [write] = writes
    assert "SELECT" not in write.upper()  # the values read, not the facts again
    with status_writes(stream.catalog) as writes:
        again = store_reports(fleet, POLICY)
    assert len(writes) == 1 and all(r.status.recorded for r in again)  # A and C only
    with status_writes(stream.catalog) as writes:
        assert all(r.status.recorded for r in store_reports(fleet, POLICY))
    assert writes == []  # nothing changed: nothing written


def test_a_validation_records_each_store_once(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream(stores=[A, B, C])
    stream.run(3)
    with status_writes(stream.catalog) as writes:
        report = run_checks(fleet_on(stream), POLICY, only=[stream.key(A), stream.key(C)])
    assert [r.status.status for r in report.health] == [StoreStatus.HEALTHY] * 2
    assert all(r.status.recorded for r in report.health)
    assert recorded(stream.catalog) == {A: "healthy", B: None, C: "healthy"}
    [write] = writes  # the health read's; the run's close records nothing more
    assert "SELECT" not in write.upper()


def test_a_read_of_every_root_records_each_store_of_each_root(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A page of an unnarrowed read holds stores of several roots, with the same names."""
    first, second = make_stream("first", stores=[A, B]), make_stream("second", stores=[A])
    first.run(2)
    second.run(2)
    run_checks(fleet_on(first), POLICY, only=[first.key(A)])  # first's A: healthy
    reports = store_reports(Fleet(first.catalog, owner="t"), POLICY)
    assert all(r.status.recorded for r in reports) and len(reports) == 3
    status = {h.key: h.recorded_status for h in first.catalog.store_health(RetentionPolicy())}
    assert status == {
        first.key(A): "healthy",
        first.key(B): "unknown",
        second.key(A): "unknown",
    }
