"""A broken store's partition shows Failed, exactly it, whoever validated; sound again, it
shows Materialized. In process, on a real catalog and real checkpoint files: the partition
statuses are read back from Dagster's instance (``get_status_by_partition``, what the UI's
partition view and its Failed filter show)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetPartitionStatus,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    EventRecordsFilter,
    RunsFilter,
    SensorResult,
    build_sensor_context,
)
from dagster._core.storage.tags import PARTITION_NAME_TAG

from dagster_project.definitions import defs
from dagster_project.defs import asset_checks, partition_status, sensors, store_events
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.sensors import store_failure_sensor
from state_runtime.catalog import StoreKey
from state_runtime.maintenance import Fleet, StoreReport, run_checks
from tests.dagster.conftest import latest_states, resources_for, store_name
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.maintenance.streams import StoreStream

MATERIALIZED, FAILED = AssetPartitionStatus.MATERIALIZED, AssetPartitionStatus.FAILED


def statuses(instance: DagsterInstance, partitions: list[str]) -> dict[str, Any]:
    found = instance.get_status_by_partition(state_checkpoints.key, partitions, state_stores)
    assert found is not None
    return dict(found)


@dataclass
class FailureSensor:
    """Ticks of ``state_store_failures`` (its cursor kept), their runs executed as the daemon
    would launch them."""

    stream: StoreStream
    instance: DagsterInstance
    cursor: str | None = None

    def evaluate(self) -> SensorResult:
        """One tick's evaluation (its cursor kept), its runs not executed."""
        resources = resources_for(self.stream.catalog, FAST)
        context = build_sensor_context(
            instance=self.instance, resources=resources, cursor=self.cursor
        )
        result = store_failure_sensor(context)
        assert isinstance(result, SensorResult)
        self.cursor = result.cursor
        return result

    def tick(self) -> tuple[list[str], list[str]]:
        """The partitions this tick failed, and those it recorded again (each run checked)."""
        return self.execute(self.evaluate())

    def execute(self, result: SensorResult) -> tuple[list[str], list[str]]:
        """The runs a tick requested: the partitions they failed, and those they recorded."""
        resources = resources_for(self.stream.catalog, FAST)
        job = defs.resolve_job_def("state_store_record_job")
        failed, recorded = [], []
        for request in result.run_requests or []:
            assert request.partition_key is not None and request.run_key
            run = job.execute_in_process(
                instance=self.instance,
                resources=resources,
                partition_key=request.partition_key,
                raise_on_error=False,
            )
            if run.success:
                recorded.append(request.partition_key)
                continue
            [failure] = [e for e in run.all_events if e.event_type is DagsterEventType.STEP_FAILURE]
            assert "broken" in str(failure.step_failure_data.user_failure_data)
            failed.append(request.partition_key)
        return failed, recorded

    def quiet(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A tick when no open problem is new or resolved: it reads the open problems only,
        not the stores' reports (refused here), and requests nothing."""

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a quiet tick read the stores' reports")

        with monkeypatch.context() as patched:
            patched.setattr(sensors, "store_reports", refuse)
            assert self.tick() == ([], [])

    def fail_broken(self) -> list[str]:
        failed, recorded = self.tick()
        assert not recorded
        return failed


def page(instance: DagsterInstance, partition: str) -> dict[str, Any]:
    """What the partition's page shows: its latest materialization's metadata with the values
    of the observations that followed it (the UI's "Observed in run ..."), and whether its
    latest run (the one the red banner names) failed."""
    key = state_checkpoints.key
    [materialized] = instance.fetch_materializations(
        AssetRecordsFilter(key, asset_partitions=[partition]), limit=1
    ).records
    observed = instance.fetch_observations(
        AssetRecordsFilter(key, asset_partitions=[partition]), limit=50, ascending=True
    ).records
    shown: dict[str, Any] = {}
    for record in [materialized, *observed]:
        if record.timestamp >= materialized.timestamp and record.asset_event is not None:
            shown |= {
                k: (v.value, record.timestamp) for k, v in record.asset_event.metadata.items()
            }
    [run] = instance.get_runs(RunsFilter(tags={PARTITION_NAME_TAG: partition}), limit=1) or [None]
    return {
        "metadata": {k: value for k, (value, _) in shown.items()},
        "stale": sorted(k for k, (_, at) in shown.items() if at == materialized.timestamp),
        "banner": run is not None and run.status is DagsterRunStatus.FAILURE,
    }


def break_store(stream: StoreStream) -> tuple[Path, bytes]:
    """Deletes a delta the latest versions of the second store need; returns it to restore."""
    lost = stream.storage.root / stream.committed[stream.stores[1]][4].path
    content = lost.read_bytes()
    lost.unlink()
    return lost, content


def validated(
    stream: StoreStream, instance: DagsterInstance
) -> tuple[list[str], FailureSensor, Fleet]:
    """Six batches run on ``stream``, its stores' partitions added and validated from the CLI:
    the partitions, their failures sensor and the CLI's fleet (owner ``ops-laptop:4242``)."""
    stream.run(6)
    partitions = [store_name(stream, s) for s in stream.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    sensor = FailureSensor(stream, instance)
    cli = Fleet(stream.catalog, owner="ops-laptop:4242")
    run_checks(cli, FAST)
    return partitions, sensor, cli


def test_a_validation_in_dagster_fails_exactly_the_broken_partition_until_it_is_sound(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = make_stream()
    stream.run(6)
    resources = resources_for(stream.catalog, FAST)
    partitions = [store_name(stream, s) for s in stream.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    sensor = FailureSensor(stream, instance)
    validation = defs.resolve_job_def("state_validation_job")
    assert validation.execute_in_process(instance=instance, resources=resources).success
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert sensor.fail_broken() == []

    lost, content = break_store(stream)
    broken = store_name(stream, stream.stores[1])
    capsys.readouterr()
    failing = validation.execute_in_process(
        instance=instance, resources=resources, raise_on_error=False
    )
    assert not failing.success  # the blocking lineage_valid failed its step
    # Expected and recorded too: the failed check and its first finding, one paragraph.
    console = capsys.readouterr().err
    assert "Traceback" not in console and "Stack Trace" not in console
    assert "DagsterAssetCheckFailedError" not in console
    [why] = [line for line in console.splitlines() if line.startswith("lineage_valid failed: ")]
    assert "1 problem(s) in 1 store(s); first: " in why and lost.name in why
    assert latest_states(instance)[broken]["status"] == "broken"
    assert statuses(instance, partitions)[broken] == MATERIALIZED  # until the sensor's tick
    capsys.readouterr()
    assert sensor.fail_broken() == [broken]
    # The failure is expected and recorded: the console shows it once, as its paragraph.
    console = capsys.readouterr().err
    assert "Traceback" not in console and "Stack Trace" not in console
    [why] = [line for line in console.splitlines() if line.startswith("broken since ")]
    assert lost.name in why and "version 6" in why
    truth = {p: FAILED if p == broken else MATERIALIZED for p in partitions}
    assert statuses(instance, partitions) == truth
    # Failed stays failed: the next validation observes the broken store, the sensor
    # has nothing left to fail.
    validation.execute_in_process(instance=instance, resources=resources, raise_on_error=False)
    assert sensor.fail_broken() == []
    assert statuses(instance, partitions) == truth
    sensor.quiet(monkeypatch)  # the same open problem: nothing read but the problems

    # The file restored, the next validation finds the store sound: materialized again, and
    # the sensor's run on the partition clears its page's banner.
    lost.write_bytes(content)
    assert validation.execute_in_process(instance=instance, resources=resources).success
    assert latest_states(instance)[broken]["status"] == "healthy"
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert sensor.tick() == ([], [broken])
    assert not page(instance, broken)["banner"]
    assert sensor.tick() == ([], [])
    sensor.quiet(monkeypatch)


def test_an_unexpected_error_in_a_validation_keeps_its_trace(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only an expected failure is shown without its trace: an error nobody raised on purpose
    in a validation run is printed with its stack trace."""
    stream = make_stream()

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("nobody expected this")

    monkeypatch.setattr(asset_checks, "run_checks", boom)
    validation = defs.resolve_job_def("state_validation_job")
    capsys.readouterr()
    run = validation.execute_in_process(
        instance=instance, resources=resources_for(stream.catalog, FAST), raise_on_error=False
    )
    assert not run.success
    console = capsys.readouterr().err
    assert "RuntimeError: nobody expected this" in console and "Stack Trace" in console


def test_the_failed_partition_shows_why_and_clears_once_sound(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Validated from the CLI, the failures sensor may tick before the catalog sensor has
    reported the validation: the failed partition's page shows the broken status and reason as
    its latest metadata, none of its last sound materialization's values. Sound again, the
    catalog sensor's report materializes the partition, and the failures sensor's run clears
    the red banner of the page (its latest run). Then a run on the sound partition records
    it, never fails."""
    stream = make_stream()
    partitions, sensor, cli = validated(stream, instance)
    first = tick(stream, instance, None)
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)

    lost, content = break_store(stream)
    broken = store_name(stream, stream.stores[1])
    run_checks(cli, FAST)
    assert sensor.fail_broken() == [broken]  # before the catalog sensor's report
    assert statuses(instance, partitions) == {
        p: FAILED if p == broken else MATERIALIZED for p in partitions
    }
    shown = page(instance, broken)
    assert shown["banner"] and not shown["stale"]
    assert shown["metadata"]["status"] == "broken"
    assert lost.name in shown["metadata"]["status_reason"]
    second = tick(stream, instance, first.cursor)
    assert page(instance, broken)["metadata"]["status"] == "broken"

    lost.write_bytes(content)
    run_checks(cli, FAST)
    tick(stream, instance, second.cursor)
    assert statuses(instance, partitions) == dict.fromkeys(partitions, MATERIALIZED)
    assert page(instance, broken)["banner"]  # the partition's latest run is the failed one
    assert sensor.tick() == ([], [broken])
    shown = page(instance, broken)
    assert not shown["banner"] and shown["metadata"]["status"] == "healthy"
    assert sensor.tick() == ([], [])

    # Materializing a sound store's partition records its state now; it never fails.
    job = defs.resolve_job_def("state_store_record_job")
    resources = resources_for(stream.catalog, FAST)
    recorded = job.execute_in_process(instance=instance, resources=resources, partition_key=broken)
    [event] = recorded.get_asset_materialization_events()
    assert event.partition == broken
    assert event.materialization.metadata["status"].value == "healthy"


def test_a_tick_after_a_change_reads_only_the_broken_and_failed_stores_reports(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick that finds a problem new or resolved reads the reports of the stores with open
    problems and of the failed partitions, not the fleet's: at 100,000 stores the fleet's
    reports made that tick minutes long (``make bench-ticks``; 1.5 s at 2,000 stores)."""
    stream, other = make_stream(), make_stream("other", query="other-query")
    for each in (stream, other):
        each.run(6)
    partitions = [store_name(s, store) for s in (stream, other) for store in s.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    read: list[list[StoreKey]] = []
    real = sensors.store_reports

    def spied(*args: Any, **kwargs: Any) -> list[StoreReport]:
        found = real(*args, **kwargs)
        read.append([r.key for r in found])
        return found

    monkeypatch.setattr(sensors, "store_reports", spied)
    sensor = FailureSensor(stream, instance)
    cli = Fleet(stream.catalog, owner="ops-laptop:4242")
    run_checks(cli, FAST)
    assert sensor.tick() == ([], []) and read == []  # nothing broken, nothing failed

    lost, content = break_store(stream)
    broken = stream.key(stream.stores[1])
    run_checks(cli, FAST)
    assert sensor.fail_broken() == [store_name(stream, stream.stores[1])]
    assert read == [[broken]]

    lost.write_bytes(content)
    run_checks(cli, FAST)
    assert sensor.tick() == ([], [store_name(stream, stream.stores[1])])
    assert read[1:] == [[broken]]  # the failed partition's store, sound again


def test_a_tick_after_a_change_reads_the_statuses_of_the_partitions_that_matter_only(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick after a change neither lists the asset's partitions nor brings its status cache
    up to date (at 100,000 partitions that was 8 s of the tick: ``make bench-failure-ticks``):
    it asks Dagster about the broken stores' partitions and those Dagster shows Failed, and
    still finds one its cursor does not know: a sound store's partition whose run failed for
    another reason (the catalog unreadable) is recorded again."""
    stream = make_stream()
    partitions, sensor, cli = validated(stream, instance)
    assert sensor.tick() == ([], [])

    sound = store_name(stream, stream.stores[0])

    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the catalog is unreachable")

    with monkeypatch.context() as patched:
        patched.setattr(store_events, "store_reports", unreadable)
        run = defs.resolve_job_def("state_store_record_job").execute_in_process(
            instance=instance,
            resources=resources_for(stream.catalog, FAST),
            partition_key=sound,
            raise_on_error=False,
        )
    assert not run.success and statuses(instance, partitions)[sound] == FAILED

    break_store(stream)
    broken = store_name(stream, stream.stores[1])
    run_checks(cli, FAST)
    asked: list[list[str]] = []
    existing = instance.get_existing_dynamic_partitions

    def spied(name: str, keys: list[str]) -> Any:
        asked.append(sorted(keys))
        return existing(name, keys)

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the tick read every partition")

    with monkeypatch.context() as patched:
        patched.setattr(instance, "get_existing_dynamic_partitions", spied)
        for read in ("get_dynamic_partitions", "get_status_by_partition"):
            patched.setattr(instance, read, refused)
        result = sensor.evaluate()
    assert asked == [sorted([broken, sound])]
    assert sensor.execute(result) == ([broken], [sound])
    shown = statuses(instance, [broken, sound])
    assert shown == {broken: FAILED, sound: MATERIALIZED}
    assert sensor.tick() == ([], [])


def test_a_canceled_clearing_run_is_requested_again(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Dagster keeps a partition Failed until something materializes it: the sensor's run that
    would clear a sound store's partition canceled before it materializes, the partition still
    shows Failed, and the next tick requests that run again (the latest attempt, canceled, does
    not decide)."""
    stream = make_stream()
    _, sensor, cli = validated(stream, instance)
    assert sensor.tick() == ([], [])
    lost, content = break_store(stream)
    broken = store_name(stream, stream.stores[1])
    run_checks(cli, FAST)
    assert sensor.fail_broken() == [broken]
    assert statuses(instance, [broken])[broken] == FAILED  # viewed in the UI: its cache built

    lost.write_bytes(content)
    run_checks(cli, FAST)
    assert [r.partition_key for r in sensor.evaluate().run_requests or []] == [broken]
    # the daemon creates the run, canceled before its step materializes the partition
    job = defs.resolve_job_def("state_store_record_job")
    run = instance.create_run_for_job(job_def=job, tags={PARTITION_NAME_TAG: broken})
    instance.report_run_canceled(run)
    assert statuses(instance, [broken])[broken] == FAILED
    assert sensor.tick() == ([], [broken])
    assert statuses(instance, [broken])[broken] == MATERIALIZED
    assert sensor.tick() == ([], [])


def test_the_first_tick_after_the_upgrade_reads_the_past_attempts_a_page_a_tick(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cursor from before the event log's storage id was kept must still find the sound
    stores' partitions other runs failed before the upgrade, but reading every attempt ever
    made in one tick took 14 s at 40,000 attempts: the partitions are asked about
    ``PAST_A_READ`` a tick (a page of Dagster's partitions, oldest first), and each failed
    partition is recorded again once its page is read."""
    monkeypatch.setattr(partition_status, "PAST_A_READ", 2)
    stream = make_stream()
    partitions, sensor, _ = validated(stream, instance)

    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the catalog is unreachable")

    job = defs.resolve_job_def("state_store_record_job")
    with monkeypatch.context() as patched:
        patched.setattr(store_events, "store_reports", unreadable)
        for partition in partitions:  # runs that failed before the upgrade, one a partition
            run = job.execute_in_process(
                instance=instance,
                resources=resources_for(stream.catalog, FAST),
                partition_key=partition,
                raise_on_error=False,
            )
            assert not run.success
    assert set(statuses(instance, partitions).values()) == {FAILED}
    storage = instance.event_log_storage
    grouped, paged = storage.get_latest_storage_id_by_partition, storage.get_event_records
    unbounded: list[str] = []

    def grouped_read(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("partitions") is None and kwargs.get("after_cursor") is None:
            unbounded.append("every attempt grouped")
        return grouped(*args, **kwargs)

    def page_read(records: EventRecordsFilter, *args: Any, **kwargs: Any) -> Any:
        if records.asset_partitions is None and kwargs.get("limit") is None:
            unbounded.append("every attempt listed")
        return paged(records, *args, **kwargs)

    sensor.cursor = json.dumps({"failed": [], "census": None, "shown": []})  # before the upgrade
    recorded: list[list[str]] = []
    with monkeypatch.context() as patched:
        patched.setattr(storage, "get_latest_storage_id_by_partition", grouped_read)
        patched.setattr(storage, "get_event_records", page_read)
        for _ in range(len(partitions) + 2):
            failed, cleared = sensor.tick()
            assert not failed
            recorded.append(cleared)
    assert not unbounded
    assert sorted(p for cleared in recorded for p in cleared) == sorted(partitions)
    assert max(len(cleared) for cleared in recorded) <= 2  # a page of 2 attempts a tick
    assert set(statuses(instance, partitions).values()) == {MATERIALIZED}
    assert json.loads(sensor.cursor or "")["past"] is None
    sensor.quiet(monkeypatch)
