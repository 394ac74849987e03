"""Jobs and schedules: snapshots often, validation hourly, cleanup daily, reconciliation weekly.

Each job carries a ``state_runtime/maintenance`` tag: with the run queue's tag concurrency
limit (``dagster_project/dagster.yaml``) two runs of one kind never overlap; the catalog
leases keep two runs off the same store even if they do.
"""

from __future__ import annotations

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    RunConfig,
    ScheduleDefinition,
    define_asset_job,
)

from dagster_project.defs.assets import (
    CleanupConfig,
    state_checkpoints,
    state_reconciliation,
    state_retention_cleanup,
    state_snapshots,
    state_store_health,
)

KIND_TAG = "state_runtime/maintenance"

snapshot_job = define_asset_job(
    "state_snapshot_job",
    selection=AssetSelection.assets(state_snapshots),
    description="Snapshot the stores whose delta chains passed the threshold.",
    tags={KIND_TAG: "snapshot"},
)
validation_job = define_asset_job(
    "state_validation_job",
    selection=AssetSelection.assets(state_store_health)
    | AssetSelection.checks_for_assets(state_checkpoints.key),
    description="Read every store's health and run the lineage, retention, lag and orphan checks.",
    tags={KIND_TAG: "validate"},
)
cleanup_job = define_asset_job(
    "state_cleanup_job",
    selection=AssetSelection.assets(state_retention_cleanup),
    description="Delete what retention allows (dry run unless configured otherwise).",
    tags={KIND_TAG: "cleanup"},
)
reconcile_job = define_asset_job(
    "state_reconcile_job",
    selection=AssetSelection.assets(state_reconciliation),
    description="List storage and record files the catalog does not know.",
    tags={KIND_TAG: "reconcile"},
)

snapshot_schedule = ScheduleDefinition(
    name="state_snapshots_every_15_minutes",
    job=snapshot_job,
    cron_schedule="*/15 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
)
validation_schedule = ScheduleDefinition(
    name="state_validation_hourly",
    job=validation_job,
    cron_schedule="5 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
)
cleanup_schedule = ScheduleDefinition(
    name="state_cleanup_daily",
    job=cleanup_job,
    cron_schedule="30 3 * * *",
    run_config=RunConfig(ops={"state_retention_cleanup": CleanupConfig(dry_run=False)}),
    default_status=DefaultScheduleStatus.RUNNING,
)
reconcile_schedule = ScheduleDefinition(
    name="state_reconcile_weekly",
    job=reconcile_job,
    cron_schedule="0 4 * * 0",
    default_status=DefaultScheduleStatus.STOPPED,
)

jobs = [snapshot_job, validation_job, cleanup_job, reconcile_job]
schedules = [snapshot_schedule, validation_schedule, cleanup_schedule, reconcile_schedule]
