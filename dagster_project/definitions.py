"""The ``state_maintenance`` code location: ``dagster dev -w workspace.yaml``.

Resources default to what ``make demo`` produces and follow the platform's environment
(``STATE_CATALOG_URL``, ``STATE_CHECKPOINT_ROOT``, ``STATE_MAINTENANCE_*``). Nothing that
writes or deletes starts on its own: see ``defs/automation.py`` (``STATE_DAGSTER_AUTOSTART``).
"""

from __future__ import annotations

from dagster import Definitions

from dagster_project.defs.asset_checks import state_checkpoint_checks
from dagster_project.defs.assets import (
    state_reconciliation,
    state_retention_cleanup,
    state_snapshot_repair,
    state_snapshots,
    state_store_health,
)
from dagster_project.defs.automation import check_autostart
from dagster_project.defs.catalog_events import catalog_report_job, state_batch_metrics
from dagster_project.defs.console import console_logger
from dagster_project.defs.jobs import jobs, schedules
from dagster_project.defs.repartition_job import state_repartition_job
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.sensors import sensors
from dagster_project.defs.store_events import record_store_state


def resources() -> dict[str, object]:
    """The one maintenance resource, nothing configured: it reads the environment when a run
    starts. No URL in its config above all: Dagster shows config values in its UI, and the URL
    may carry a password."""
    return {"maintenance": MaintenanceResource()}


check_autostart([s.name for s in schedules] + [s.name for s in sensors])

defs = Definitions(
    assets=[
        record_store_state,
        state_snapshots,
        state_retention_cleanup,
        state_snapshot_repair,
        state_store_health,
        state_reconciliation,
        state_batch_metrics,
    ],
    asset_checks=[state_checkpoint_checks],
    jobs=[*jobs, catalog_report_job, state_repartition_job],
    schedules=schedules,
    sensors=sensors,
    resources=resources(),
    loggers={"console": console_logger},  # an expected failure as its paragraph, no trace
)
