"""Whoever reports first, each store's latest state in Dagster names the validation from the
CLI that found it. In process, on a real catalog and real checkpoint files, the orders
``dagster dev`` ran into under load (tests/dagster/test_dagster_dev.py): the failures
sensor's run on the broken partition after the catalog sensor's report, its run that records
the repaired store after the report of the validation that found it sound, and a report
requested before the validation that runs after it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context

from dagster_project.defs.catalog_events import catalog_events_sensor, catalog_report_job
from state_runtime.maintenance import Fleet, run_checks
from tests.dagster.conftest import latest_events, resources_for, store_name
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.dagster.test_store_failures import FailureSensor, break_store
from tests.maintenance.streams import StoreStream


def described(instance: DagsterInstance) -> dict[str, tuple[str, str]]:
    """Each partition's latest state (materialization or observation): status, description."""
    return {
        partition: (event.metadata["status"].value, event.description or "")
        for partition, event in latest_events(instance).items()
    }


def validate_from_the_cli(stream: StoreStream) -> str:
    """Breaks the second store and validates as the CLI does; returns who validated, as the
    events say it."""
    break_store(stream)
    return cli_validation(stream)


def cli_validation(stream: StoreStream, owner: str = "ops-laptop:4242") -> str:
    """Validates as the CLI does (run by ``owner``); returns who validated, as the events say
    it."""
    report = run_checks(Fleet(stream.catalog, owner=owner), FAST)
    return f"validate run {report.run_id} by {owner}"


def assert_named(stream: StoreStream, instance: DagsterInstance, by_cli: str) -> None:
    """Each partition's latest state is true (the second store broken) and names the
    validation ``by_cli``."""
    broken = store_name(stream, stream.stores[1])
    latest = described(instance)
    assert {p: status for p, (status, _) in latest.items()} == {
        store_name(stream, s): "broken" if store_name(stream, s) == broken else "healthy"
        for s in stream.stores
    }
    assert all(by_cli in description for _, description in latest.values()), latest


def queued_report(
    stream: StoreStream, instance: DagsterInstance
) -> tuple[SensorResult, Callable[[], None]]:
    """The report the catalog sensor requests when the stores' partitions appear after its
    first tick, not run yet, and a call that runs it."""
    first = tick(stream, instance, None)  # before the stores' partitions
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    resources = resources_for(stream.catalog, FAST)
    context = build_sensor_context(instance=instance, cursor=first.cursor, resources=resources)
    queued = catalog_events_sensor(context)  # the partitions changed: a report, queued
    assert isinstance(queued, SensorResult) and queued.run_requests

    def run() -> None:
        for request in queued.run_requests:
            report = catalog_report_job.execute_in_process(
                run_config=request.run_config, instance=instance, resources=resources
            )
            assert report.success

    return queued, run


@pytest.mark.parametrize("owner", ["ops-laptop:4242", "ops: laptop: 4242"])
def test_the_failures_sensors_runs_after_the_reports_keep_who_validated(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance, owner: str
) -> None:
    """The failures sensor's run that fails the broken partition, and the one that records it
    again once repaired, each after the catalog sensor's report of the validation that found
    it: the partition's latest event still names that validation, whoever ran it (an owner
    may hold ": ", the separator of a report's description and its summary)."""
    stream = make_stream()
    stream.run(6)
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    first = tick(stream, instance, None)
    lost, content = break_store(stream)
    by_cli = cli_validation(stream, owner)
    second = tick(stream, instance, first.cursor)  # the report of the CLI's validation
    assert_named(stream, instance, by_cli)
    sensor = FailureSensor(stream, instance)
    assert sensor.fail_broken() == [store_name(stream, stream.stores[1])]
    assert_named(stream, instance, by_cli)  # failed, its state as reported

    lost.write_bytes(content)
    by_cli = cli_validation(stream, owner)
    tick(stream, instance, second.cursor)  # the repaired store's state, reported
    repaired = store_name(stream, stream.stores[1])
    assert described(instance)[repaired][0] == "healthy"
    assert by_cli in described(instance)[repaired][1]
    assert sensor.tick() == ([], [repaired])
    assert described(instance)[repaired][0] == "healthy"  # recorded again, as reported
    assert by_cli in described(instance)[repaired][1]


def test_a_report_requested_before_the_validation_names_it(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """A report requested when the partitions appeared, run after the CLI's validation: it
    logs the states that validation found, so the validation's own report has no state left
    to log."""
    stream = make_stream()
    stream.run(6)
    queued, run = queued_report(stream, instance)
    by_cli = validate_from_the_cli(stream)
    run()
    assert_named(stream, instance, by_cli)
    tick(stream, instance, queued.cursor)  # the validation's own report
    assert_named(stream, instance, by_cli)
