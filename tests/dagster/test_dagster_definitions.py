"""The code location loads; assets, checks, sensors and schedules run in process on real stores."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetPartitionStatus,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    RunRequest,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    materialize,
)
from dagster._core.system_config.objects import ResolvedRunConfig

from dagster_project.definitions import defs
from dagster_project.defs.asset_checks import state_checkpoint_checks
from dagster_project.defs.assets import (
    state_checkpoints,
    state_reconciliation,
    state_retention_cleanup,
    state_snapshots,
    state_store_health,
)
from dagster_project.defs.jobs import cleanup_schedule, snapshot_schedule, validation_schedule
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.sensors import snapshot_due_sensor, store_discovery_sensor
from state_runtime.catalog import Catalog, RetentionPolicy, catalog_url
from state_runtime.catalog.schema.tables import stores
from state_runtime.errors import MaintenanceRefused
from state_runtime.maintenance import CHECKS, MaintenancePolicy
from state_runtime.settings import MAINTENANCE
from state_runtime.store.state_schema import StateSchema
from tests.dagster.conftest import resources_for, store_name
from tests.maintenance.streams import KEY, StoreStream

# snapshots after 5 deltas; superseded files may go at once (the tests cannot wait an hour)
FAST = MaintenancePolicy(
    snapshot_min_deltas=5,
    retention=RetentionPolicy(window=timedelta(0)),
    min_window=timedelta(0),
)


def metadata(result: Any, key: str) -> dict[str, Any]:
    events = result.asset_materializations_for_node(key)
    [event] = [e for e in events if e.asset_key == AssetKey(key)]  # not the stores' partitions
    return {name: value.value for name, value in event.metadata.items()}


def test_the_code_location_loads_with_the_demo_defaults() -> None:
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {
        "state_checkpoints",
        "state_snapshots",
        "state_retention_cleanup",
        "state_snapshot_repair",
        "state_store_health",
        "state_reconciliation",
        "state_batch_metrics",
    }
    assert {c.name for c in repo.asset_graph.asset_check_keys} == {
        "lineage_valid",
        "retention_within_policy",
        "snapshot_lag",
        "orphan_growth",
        "store_status",
        "commit_lag",
    }
    assert {s.name for s in repo.schedule_defs} == {
        "state_snapshots_every_15_minutes",
        "state_validation_hourly",
        "state_cleanup_daily",
        "state_reconcile_weekly",
    }
    assert {s.name for s in repo.sensor_defs} == {
        "state_store_discovery",
        "state_snapshot_due",
        "state_catalog_events",
        "state_store_failures",
    }
    assert MaintenanceResource().resolved_url() == catalog_url()


def test_every_registered_check_has_a_dagster_spec_and_is_evaluated() -> None:
    """Dagster's checks and run_checks' outcomes are both built from the one registry."""
    specs = {key.name for key in state_checkpoint_checks.check_keys}
    assert specs == {check.name.value for check in CHECKS}
    blocking = {spec.name for spec in state_checkpoint_checks.check_specs if spec.blocking}
    assert blocking == {check.name.value for check in CHECKS if check.blocking}
    fleet_wide = {check.name for check in CHECKS if not check.per_store}
    assert fleet_wide == {check.name for check in CHECKS if check.evaluate is not None}


def test_the_resource_fields_are_the_declared_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each maintenance setting is a field; unset, the environment applies when read."""
    fields = MaintenanceResource.model_fields
    assert {s.name for s in MAINTENANCE} <= set(fields)
    monkeypatch.setenv("STATE_MAINTENANCE_WINDOW", "3h")
    assert MaintenanceResource().policy().retention.window == timedelta(hours=3)
    assert MaintenanceResource(window="2h").policy().retention.window == timedelta(hours=2)
    assert MaintenanceResource.of(FAST).policy() == FAST
    with pytest.raises(MaintenanceRefused, match="retain_versions=1"):
        MaintenanceResource(retain_versions=1).policy()


def test_snapshot_cleanup_and_health_assets(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(7)
    resources = resources_for(stream.catalog, FAST)
    snap = materialize([state_snapshots], resources=resources, instance=instance)
    figures = metadata(snap, "state_snapshots")
    assert figures["written"] == 3 and figures["failed"] == 0
    assert store_name(stream, stream.stores[0]) in figures["outcomes"]
    stream.run(2)

    dry = materialize([state_retention_cleanup], resources=resources, instance=instance)
    planned = metadata(dry, "state_retention_cleanup")
    assert planned["dry_run"] is True and planned["planned_files"] == 3 * 7
    assert "superseded" in planned["would_delete"]
    assert planned["deleted_files"] == 0 and all(
        (stream.storage.root / i.path).exists() for s in stream.stores for i in stream.committed[s]
    )
    run_config = {"ops": {"state_retention_cleanup": {"config": {"dry_run": False}}}}
    done = materialize(
        [state_retention_cleanup], resources=resources, instance=instance, run_config=run_config
    )
    assert metadata(done, "state_retention_cleanup")["deleted_files"] == 3 * 7
    assert len(stream.catalog.deletion_history(root=stream.root)) == 3 * 7
    for store in stream.stores:
        assert stream.loaded(store, 9) == stream.expected(store, 9)

    partitions = [store_name(stream, s) for s in stream.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    recorded = stream.catalog.schema_history(stream.root, 0, "default")
    assert recorded is not None  # operator 0 gains a field from batch 9
    evolved, _ = recorded.evolve(StateSchema.of(KEY, "count bigint, best int"), None, 9)
    stream.catalog.record_schema_history(stream.root, 0, "default", evolved)
    health = materialize([state_store_health], resources=resources, instance=instance)
    totals = metadata(health, "state_store_health")
    assert totals["stores"] == 3 and totals["max_deltas_since_snapshot"] == 2
    assert len(totals["stores_table"].records) == 3
    materialized = instance.fetch_materializations(state_checkpoints.key, limit=100).records
    by_partition = {
        r.partition_key: r.asset_materialization.metadata  # type: ignore[union-attr]
        for r in materialized
    }
    assert set(by_partition) == set(partitions)
    assert {m["latest_version"].value for m in by_partition.values()} == {9}
    assert {m["recovery_files"].value for m in by_partition.values()} == {3}
    assert {m["versions_retained"].value for m in by_partition.values()} == {3}  # 7, 8, 9
    assert {m["status"].value for m in by_partition.values()} == {"unknown"}
    versions = {p: m["schema_versions"].value for p, m in by_partition.items()}
    assert versions == {
        store_name(stream, s): 2 if s.operator_id == 0 else 1 for s in stream.stores
    }
    changed = by_partition[store_name(stream, stream.stores[0])]["schema_history"].value
    assert "| 9 |" in changed and "add value field best int (null for older rows)" in changed
    # every store's partition now shows as materialized, with its latest figures
    status = instance.get_status_by_partition(state_checkpoints.key, partitions, state_stores)
    assert status is not None and set(status.values()) == {AssetPartitionStatus.MATERIALIZED}


def test_cleanup_refuses_an_unsafe_window(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(2)
    unsafe = MaintenancePolicy(retention=RetentionPolicy(window=timedelta(minutes=1)))
    result = materialize(
        [state_retention_cleanup],
        resources=resources_for(stream.catalog, unsafe),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type is DagsterEventType.STEP_FAILURE]
    error = failure.step_failure_data.error
    assert error is not None and error.cause is None  # the paragraph alone, no chained trace
    assert error.message.startswith(
        "dagster._core.definitions.events.Failure: error: refused: [STATE_MAINTENANCE_REFUSED] "
        "retention window 1m is shorter than the configured minimum"
    )
    assert failure.step_failure_data.user_failure_data.metadata["code"].value == (
        "STATE_MAINTENANCE_REFUSED"
    )


def test_catalog_down_fails_the_step_with_one_paragraph(instance: DagsterInstance) -> None:
    """PostgreSQL down (nothing listens on the port): the step fails with the paragraph the
    CLI prints, naming the next step."""
    down = MaintenanceResource(catalog_url="postgresql+psycopg2://postgres@127.0.0.1:9/state")
    result = materialize(
        [state_retention_cleanup],
        resources={"maintenance": down},
        instance=instance,
        raise_on_error=False,
    )
    [failure] = [e for e in result.all_events if e.event_type is DagsterEventType.STEP_FAILURE]
    data = failure.step_failure_data
    assert data.error is not None and data.error.cause is None
    description = data.user_failure_data.description
    assert description.startswith("error: [STATE_CATALOG_UNAVAILABLE] cannot connect")
    assert "`pg_isready -h 127.0.0.1 -p 9`" in description
    assert description.splitlines()[1].startswith("full trace: ") and description.count("\n") == 1


def run_checks(resources: dict[str, Any], instance: DagsterInstance, *names: str) -> Any:
    """Execute the checks on ``state_checkpoints`` (all, or the named ones) in process."""
    selection = (
        AssetSelection.checks(*(AssetCheckKey(state_checkpoints.key, n) for n in names))
        if names
        else AssetSelection.checks_for_assets(state_checkpoints.key)
    )
    return materialize(
        [state_checkpoints, state_checkpoint_checks],
        selection=selection,
        resources=resources,
        instance=instance,
        raise_on_error=False,  # a failing lineage_valid is blocking: it fails the step
    )


def check_results(result: Any) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_checks_pass_then_a_broken_store_fails_lineage_naming_the_file(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    resources = resources_for(stream.catalog, FAST)
    ok = check_results(run_checks(resources, instance))
    assert set(ok) == {"lineage_valid", "retention_within_policy", "snapshot_lag", "orphan_growth"}
    assert all(e.passed for e in ok.values())

    middle = stream.committed[stream.stores[1]][4]  # version 5, needed by 6 and 5
    (stream.storage.root / middle.path).unlink()
    snapshot = next(iter(stream.storage.root.glob("**/*.snapshot")), None)
    assert snapshot is None
    broken = check_results(run_checks(resources, instance))
    lineage = broken["lineage_valid"]
    assert not lineage.passed and lineage.severity.value == "ERROR"
    assert lineage.metadata["first_file"].value == middle.path
    assert middle.path in lineage.metadata["findings"].value
    assert middle.path in (lineage.description or "")


def test_a_corrupt_snapshot_fails_lineage(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    resources = resources_for(stream.catalog, FAST)
    materialize([state_snapshots], resources=resources, instance=instance)
    stream.run(1)
    [snapshot, *_] = sorted(stream.storage.root.glob("state/0/0/default/*.snapshot"))
    snapshot.write_bytes(snapshot.read_bytes()[:-7] + b"corrupt")
    full = resources_for(stream.catalog, replace(FAST, verify_sample_percent=100))  # in place
    lineage = check_results(run_checks(full, instance))["lineage_valid"]
    assert not lineage.passed
    assert (
        lineage.metadata["first_file"].value == snapshot.relative_to(stream.storage.root).as_posix()
    )


def test_snapshot_lag_check_warns(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(4)
    lagging = MaintenancePolicy(snapshot_min_deltas=2, lag_warn_deltas=3, lag_error_deltas=10)
    lag = check_results(run_checks(resources_for(stream.catalog, lagging), instance))[
        "snapshot_lag"
    ]
    assert not lag.passed and lag.severity.value == "WARN"
    assert lag.metadata["max_deltas_since_snapshot"].value == 4
    only = check_results(
        run_checks(resources_for(stream.catalog, lagging), instance, "snapshot_lag")
    )
    assert set(only) == {"snapshot_lag"}


def test_sensors_discover_stores_and_request_snapshots(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = make_stream()
    stream.run(3)
    resources = resources_for(stream.catalog, FAST)
    context = build_sensor_context(instance=instance, resources=resources)
    found = store_discovery_sensor(context)
    assert isinstance(found, SensorResult)
    [request] = found.dynamic_partitions_requests
    assert sorted(request.partition_keys) == sorted(store_name(stream, s) for s in stream.stores)
    instance.add_dynamic_partitions("state_stores", list(request.partition_keys))
    again = store_discovery_sensor(build_sensor_context(instance=instance, resources=resources))
    assert again.skip_reason is not None and again.cursor == found.cursor

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a quiet tick listed the stores")

    with monkeypatch.context() as patched:  # the same count and newest store: nothing listed
        patched.setattr(Catalog, "stores", refuse)
        context = build_sensor_context(instance=instance, resources=resources, cursor=found.cursor)
        quiet = store_discovery_sensor(context)
    assert quiet.skip_reason is not None and quiet.cursor == found.cursor

    assert isinstance(snapshot_due_sensor(context), SkipReason)
    stream.run(2)
    due = snapshot_due_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(due, RunRequest) and due.run_key
    stores = due.run_config["ops"]["state_snapshots"]["config"]["stores"]
    assert sorted(stores) == sorted(store_name(stream, s) for s in stream.stores)
    same = snapshot_due_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(same, RunRequest) and same.run_key == due.run_key
    run = materialize(
        [state_snapshots], resources=resources, instance=instance, run_config=due.run_config
    )
    assert metadata(run, "state_snapshots")["written"] == 3


def test_schedules_request_their_jobs() -> None:
    [snap] = snapshot_schedule.evaluate_tick(build_schedule_context()).run_requests or []
    assert snap.run_config == {}
    [clean] = cleanup_schedule.evaluate_tick(build_schedule_context()).run_requests or []
    assert clean.run_config["ops"]["state_retention_cleanup"]["config"]["dry_run"] is False
    job = defs.resolve_job_def("state_cleanup_job")
    assert job.run_config_schema.config_type is not None
    # The cleanup's run names the console logger too (a failed lineage_valid as its
    # paragraph), while the launchpad still offers dry_run as a field, true by default.
    assert set(ResolvedRunConfig.build(job, clean.run_config).loggers) == {"console"}
    assert ResolvedRunConfig.build(job, {}).ops["state_retention_cleanup"].config == {
        "dry_run": True,
        "stores": [],
    }
    ops = job.run_config_schema.config_type.fields["ops"].config_type  # type: ignore[attr-defined]
    cleanup_fields = ops.fields["state_retention_cleanup"].config_type.fields["config"]
    assert set(cleanup_fields.config_type.fields) == {"dry_run", "stores"}
    rooted = {"resources": {"maintenance": {"config": {"root": "/elsewhere"}}}}
    assert ResolvedRunConfig.build(job, rooted).resources["maintenance"].config["root"] == (
        "/elsewhere"
    )
    # The validation's run, as the daemon or the launchpad starts it, names the console logger
    # that shows a failed blocking check as its paragraph; a resource's config still applies.
    [valid] = validation_schedule.evaluate_tick(build_schedule_context()).run_requests or []
    validation = defs.resolve_job_def("state_validation_job")
    assert set(ResolvedRunConfig.build(validation, valid.run_config).loggers) == {"console"}
    rooted = {"resources": {"maintenance": {"config": {"root": "/elsewhere"}}}}
    resolved = ResolvedRunConfig.build(validation, rooted).resources["maintenance"]
    assert resolved.config["root"] == "/elsewhere"
    assert AssetKey("state_retention_cleanup") in job.asset_layer.selected_asset_keys


def test_the_reconciliation_asset_records_an_untracked_file(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(2)
    store = stream.stores[0]
    lost, _ = stream.write(store)  # written, never recorded
    result = materialize(
        [state_reconciliation], resources=resources_for(stream.catalog, FAST), instance=instance
    )
    figures = metadata(result, "state_reconciliation")
    assert figures["untracked"] == 1 and figures["recorded"] == 1
    assert f"| {lost.path} | written |" in figures["files"]
    assert stream.catalog.explain(stream.root, lost.path, FAST.retention).file is not None


def test_commit_lag_is_checked_per_store_on_its_partition(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """The freshness signal: a store whose stream stopped committing warns on its own
    partition, with its commit lag in the metadata; the others pass."""
    stale = make_stream("stale")
    stale.run(2)
    fresh = make_stream("fresh")
    fresh.run(2)
    with stale.catalog.engine.begin() as connection:  # its stream stopped an hour ago
        connection.execute(
            stores.update()
            .where(stores.c.checkpoint_root == stale.root)
            .values(last_committed_at=datetime.now(UTC) - timedelta(hours=1))
        )
    policy = replace(FAST, commit_lag_warn=timedelta(minutes=15))
    partitions = [store_name(s, store) for s in (stale, fresh) for store in s.stores]
    instance.add_dynamic_partitions("state_stores", partitions)
    result = run_checks(resources_for(stale.catalog, policy), instance, "commit_lag")
    evaluations = {e.partition: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == set(partitions)
    for store in stale.stores:
        late = evaluations[store_name(stale, store)]
        assert not late.passed and late.severity.value == "WARN"
        assert "has its stream stopped?" in (late.description or "")
        assert late.metadata["commit_lag_seconds"].value >= 3600
    assert all(evaluations[store_name(fresh, s)].passed for s in fresh.stores)


def test_checks_run_after_the_stores_partitions_were_materialized(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """The validation job again after a health run: the checks on ``state_checkpoints`` (a
    partitioned asset whose partitions now have materializations) still evaluate, in a run
    that is not partitioned. A per-store check is evaluated on a store when its result
    changed: the second time, nothing changed, and only on the worst store (its headline)."""
    stream = make_stream()
    stream.run(3)
    resources = resources_for(stream.catalog, FAST)
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    for evaluated in (3, 1):
        materialize([state_store_health], resources=resources, instance=instance)
        result = run_checks(resources, instance)
        assert result.success
        evaluations = result.get_asset_check_evaluations()
        assert {e.check_name for e in evaluations} >= {"lineage_valid", "store_status"}
        per_store = [e for e in evaluations if e.check_name == "store_status"]
        assert len(per_store) == evaluated
        lineage = next(e for e in evaluations if e.check_name == "lineage_valid")
        assert lineage.passed and lineage.blocking
