"""A report's description names the runs outside Dagster whose findings the state it logs
holds, even those above an older writing transaction still open on PostgreSQL (a long
maintenance pass, a slow commit): its cursor waits for them, its description must not (the
validation's own report has no state left to log)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from dagster import DagsterInstance, SensorResult, build_sensor_context

from dagster_project.defs.catalog_events import catalog_events_sensor, catalog_report_job
from tests.catalog.test_positions import writing_elsewhere
from tests.dagster.conftest import BOTH_CATALOGS, resources_for, store_name
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.dagster.test_report_races import assert_named, validate_from_the_cli
from tests.maintenance.streams import StoreStream


@BOTH_CATALOGS
def test_a_queued_report_names_the_validation_while_an_older_write_is_open(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    first = tick(stream, instance, None)
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    resources = resources_for(stream.catalog, FAST)
    context = build_sensor_context(instance=instance, cursor=first.cursor, resources=resources)
    queued = catalog_events_sensor(context)
    assert isinstance(queued, SensorResult) and queued.run_requests
    postgres = stream.catalog.engine.dialect.name == "postgresql"
    with writing_elsewhere(stream.catalog) if postgres else nullcontext():
        by_cli = validate_from_the_cli(stream)
        for request in queued.run_requests:
            run = catalog_report_job.execute_in_process(
                run_config=request.run_config, instance=instance, resources=resources
            )
            assert run.success
    tick(stream, instance, queued.cursor)  # the validation's own report
    assert_named(stream, instance, by_cli)
