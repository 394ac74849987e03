"""The ``state_maintenance`` code location: ``dagster dev -w workspace.yaml``.

Resources default to what ``make demo`` produces and follow the platform's environment
(``STATE_CATALOG_URL``, ``STATE_CHECKPOINT_ROOT``, ``STATE_MAINTENANCE_*``).
"""

from __future__ import annotations

import os

from dagster import Definitions

from dagster_project.defs.assets import (
    state_checkpoints,
    state_reconciliation,
    state_retention_cleanup,
    state_snapshots,
    state_store_health,
)
from dagster_project.defs.checks import state_checkpoint_checks
from dagster_project.defs.jobs import jobs, schedules
from dagster_project.defs.resources import (
    CheckpointStorageResource,
    MaintenancePolicyResource,
    StateCatalogResource,
)
from dagster_project.defs.sensors import sensors
from state_runtime.maintenance import MaintenancePolicy


def resources() -> dict[str, object]:
    """Resources configured from the environment (read when the code location loads)."""
    return {
        # No URL in the resource's config: Dagster shows config values in its UI, and the URL
        # may carry a password. The resource reads STATE_CATALOG_URL when a run opens it.
        "state_catalog": StateCatalogResource(),
        "checkpoint_storage": CheckpointStorageResource(
            root=os.environ.get("STATE_CHECKPOINT_ROOT") or None
        ),
        "maintenance_policy": MaintenancePolicyResource.of(MaintenancePolicy.from_env()),
    }


defs = Definitions(
    assets=[
        state_checkpoints,
        state_snapshots,
        state_retention_cleanup,
        state_store_health,
        state_reconciliation,
    ],
    asset_checks=[state_checkpoint_checks],
    jobs=jobs,
    schedules=schedules,
    sensors=sensors,
    resources=resources(),
)
