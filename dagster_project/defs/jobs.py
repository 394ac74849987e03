"""Jobs and schedules: snapshots often, validation hourly, cleanup daily, reconciliation weekly.

``state_repartition_job`` has no schedule: an operator launches it, and it is a dry run unless
configured to execute. Every schedule is STOPPED until an operator turns it on
(``automation.py``). Each job carries
a ``state_runtime/maintenance`` tag: with the run queue's tag concurrency limit
(``dagster_project/dagster.yaml``) two runs of one kind never overlap; the catalog leases keep
two runs off the same store even if they do. The cleanup job validates first: a failing
``lineage_valid`` check (blocking) stops the run before anything is deleted; the library's
cleanup also holds every store with an open problem on its own. The validation job selects the
checks alone: their step records each store's health and the fleet's (``store_events.py``),
so a failing blocking check never leaves a step that should report it skipped.
"""

from __future__ import annotations

from dagster import (
    AssetCheckKey,
    AssetSelection,
    RunConfig,
    ScheduleDefinition,
    define_asset_job,
)

from dagster_project.defs.assets import (
    CleanupConfig,
    state_reconciliation,
    state_retention_cleanup,
    state_snapshot_repair,
    state_snapshots,
)
from dagster_project.defs.automation import schedule_status
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.console import CONSOLE, WITH_CONSOLE, console_with_op_config
from state_runtime.maintenance import CheckName

KIND_TAG = "state_runtime/maintenance"

snapshot_job = define_asset_job(
    "state_snapshot_job",
    selection=AssetSelection.assets(state_snapshots),
    description="Snapshot the stores whose delta chains passed the threshold.",
    tags={KIND_TAG: "snapshot"},
)
validation_job = define_asset_job(
    "state_validation_job",
    selection=AssetSelection.checks_for_assets(state_checkpoints.key),
    description=(
        "Validate every store, record each store's health on its partition and the fleet's on "
        "state_store_health, and run the lineage, retention, lag and orphan checks."
    ),
    tags={KIND_TAG: "validate"},
    config=WITH_CONSOLE,  # a failed blocking check as its paragraph (console.py)
)
cleanup_job = define_asset_job(
    "state_cleanup_job",
    selection=AssetSelection.assets(state_retention_cleanup)
    | AssetSelection.checks(AssetCheckKey(state_checkpoints.key, CheckName.LINEAGE.value)),
    description=(
        "Validate, then delete what retention allows (dry run unless configured otherwise). "
        "A failing lineage_valid check blocks the deletion."
    ),
    tags={KIND_TAG: "cleanup"},
    # a failed lineage_valid as its paragraph; dry_run still a field of its own (console.py)
    config=console_with_op_config("state_retention_cleanup", CleanupConfig),
)
repair_job = define_asset_job(
    "state_repair_job",
    selection=AssetSelection.assets(state_snapshot_repair),
    description="Rebuild damaged snapshots from their deltas (dry run unless configured).",
    tags={KIND_TAG: "snapshot"},
)
store_record_job = define_asset_job(
    "state_store_record_job",
    selection=AssetSelection.assets(state_checkpoints.key).without_checks(),
    description=(
        "Record one store's state from the catalog on its partition (reads only); fails for a "
        "broken store, so its partition shows Failed (requested by state_store_failures)."
    ),
    tags={KIND_TAG: "record"},  # its own kind: a queue of these never holds up the reports
    config=CONSOLE,  # a broken store's failure as its paragraph (console.py)
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
    default_status=schedule_status("state_snapshots_every_15_minutes"),
)
validation_schedule = ScheduleDefinition(
    name="state_validation_hourly",
    job=validation_job,
    cron_schedule="5 * * * *",
    default_status=schedule_status("state_validation_hourly"),
)
cleanup_schedule = ScheduleDefinition(
    name="state_cleanup_daily",
    job=cleanup_job,
    cron_schedule="30 3 * * *",
    run_config=RunConfig(ops={"state_retention_cleanup": CleanupConfig(dry_run=False)}),
    default_status=schedule_status("state_cleanup_daily"),
)
reconcile_schedule = ScheduleDefinition(
    name="state_reconcile_weekly",
    job=reconcile_job,
    cron_schedule="0 4 * * 0",
    default_status=schedule_status("state_reconcile_weekly"),
)

jobs = [snapshot_job, validation_job, cleanup_job, repair_job, reconcile_job, store_record_job]
schedules = [snapshot_schedule, validation_schedule, cleanup_schedule, reconcile_schedule]
