"""A broken store's partition shows Failed, exactly it, whoever validated; sound again, it
shows Materialized. In process, on a real catalog and real checkpoint files: the partition
statuses are read back from Dagster's instance (``get_status_by_partition``, what the UI's
partition view and its Failed filter show)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagster import (
    AssetPartitionStatus,
    DagsterEventType,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from dagster_project.definitions import defs
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.sensors import store_failure_sensor
from state_runtime.maintenance import Fleet, run_checks
from tests.dagster.conftest import latest_states, resources_for, store_name
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.maintenance.streams import StoreStream

MATERIALIZED, FAILED = AssetPartitionStatus.MATERIALIZED, AssetPartitionStatus.FAILED


def statuses(instance: DagsterInstance, partitions: list[str]) -> dict[str, Any]:
    found = instance.get_status_by_partition(state_checkpoints.key, partitions, state_stores)
    assert found is not None
    return dict(found)


def fail_broken(stream: StoreStream, instance: DagsterInstance) -> list[str]:
    """A tick of ``state_store_failures``, its runs executed as the daemon would launch them;
    the partitions it failed (each run's failure checked)."""
    resources = resources_for(stream.catalog, FAST)
    context = build_sensor_context(instance=instance, resources=resources)
    result = store_failure_sensor(context)
    if isinstance(result, SkipReason):
        return []
    assert isinstance(result, SensorResult)
    job = defs.resolve_job_def("state_store_record_job")
    failed = []
    for request in result.run_requests or []:
        assert request.partition_key is not None and request.run_key
        run = job.execute_in_process(
            instance=instance,
            resources=resources,
            partition_key=request.partition_key,
            raise_on_error=False,
        )
        assert not run.success
        [failure] = [e for e in run.all_events if e.event_type is DagsterEventType.STEP_FAILURE]
        assert "broken" in str(failure.step_failure_data.user_failure_data)
        failed.append(request.partition_key)
    return failed


def break_store(stream: StoreStream) -> tuple[Path, bytes]:
    """Deletes a delta the latest versions of the second store need; returns it to restore."""
    lost = stream.storage.root / stream.committed[stream.stores[1]][4].path
    content = lost.read_bytes()
    lost.unlink()
    return lost, content


def test_a_validation_in_dagster_fails_exactly_the_broken_partition_until_it_is_sound(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    resources = resources_for(stream.catalog, FAST)
    partitions = [store_name(stream, s) for s in stream.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    validation = defs.resolve_job_def("state_validation_job")
    assert validation.execute_in_process(instance=instance, resources=resources).success
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert fail_broken(stream, instance) == []

    lost, content = break_store(stream)
    broken = store_name(stream, stream.stores[1])
    failing = validation.execute_in_process(
        instance=instance, resources=resources, raise_on_error=False
    )
    assert not failing.success  # the blocking lineage_valid failed its step
    assert latest_states(instance)[broken]["status"] == "broken"
    assert statuses(instance, partitions)[broken] == MATERIALIZED  # until the sensor's tick
    assert fail_broken(stream, instance) == [broken]
    truth = {p: FAILED if p == broken else MATERIALIZED for p in partitions}
    assert statuses(instance, partitions) == truth
    # Failed stays failed: the next validation observes the broken store, the sensor
    # has nothing left to fail.
    validation.execute_in_process(instance=instance, resources=resources, raise_on_error=False)
    assert fail_broken(stream, instance) == []
    assert statuses(instance, partitions) == truth

    # The file restored, the next validation finds the store sound: materialized again.
    lost.write_bytes(content)
    assert validation.execute_in_process(instance=instance, resources=resources).success
    assert latest_states(instance)[broken]["status"] == "healthy"
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert fail_broken(stream, instance) == []


def test_a_validation_from_the_cli_fails_the_broken_partition_too(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """The same through the catalog sensor's report of CLI runs; and a run on a store's
    partition that executes once the store is sound again records it, never fails."""
    stream = make_stream()
    stream.run(6)
    partitions = [store_name(stream, s) for s in stream.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    cli = Fleet(stream.catalog, owner="ops-laptop:4242")
    run_checks(cli, FAST)
    first = tick(stream, instance, None)
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)

    lost, content = break_store(stream)
    broken = store_name(stream, stream.stores[1])
    run_checks(cli, FAST)
    second = tick(stream, instance, first.cursor)
    assert fail_broken(stream, instance) == [broken]
    assert statuses(instance, partitions) == {
        p: FAILED if p == broken else MATERIALIZED for p in partitions
    }

    lost.write_bytes(content)
    run_checks(cli, FAST)
    tick(stream, instance, second.cursor)
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert fail_broken(stream, instance) == []

    # Materializing a sound store's partition records its state now; it never fails.
    job = defs.resolve_job_def("state_store_record_job")
    resources = resources_for(stream.catalog, FAST)
    recorded = job.execute_in_process(instance=instance, resources=resources, partition_key=broken)
    [event] = recorded.get_asset_materialization_events()
    assert event.partition == broken
    assert event.materialization.metadata["status"].value == "healthy"
