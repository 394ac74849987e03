"""
### State store maintenance

The maintenance plan of the Dagster code location, on Airflow: from the catalog, the
**due_stores** (due for a snapshot, in groups) and the **roots**; **snapshots** (one mapped
task per group of due stores), then for each checkpoint root (a mapped task group):
**validate**, then **cleanup** (runs only when validation passed: a broken lineage blocks it),
then **health** (always runs: fails naming each broken store; otherwise updates the root's
asset for downstream DAGs).

Paused when created: nothing runs until an operator unpauses it. Cleanup is a **dry run**
unless a run is triggered with `cleanup_dry_run: false`, or the Airflow Variable
`state_runtime_cleanup` is `execute` (then scheduled runs delete what retention allows).
The catalog and the storage come from the connections `state_catalog_default` and
`state_storage_default`; the policy from the workers' `STATE_MAINTENANCE_*` environment.
Every pass is recorded in the catalog as a maintenance run (`sql/maintenance_runs.sql`).
See docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param, task_group

from state_runtime_airflow.dag_settings import maintenance_dag
from state_runtime_airflow.operators import (
    StateCleanupOperator,
    StateDueStoresOperator,
    StateHealthCheckOperator,
    StateRootsOperator,
    StateSnapshotOperator,
    StateValidationOperator,
)
from state_runtime_airflow.store_assets import MAINTAINED

DAG_ID = "state_store_maintenance"

with maintenance_dag(
    DAG_ID,
    "Snapshots, validation, cleanup gated on validation, health of the state stores",
    __doc__,
    schedule="15 * * * *",
    params={
        "roots": Param([], type="array", description="Only these checkpoint roots; [] for all."),
        "cleanup_dry_run": Param(
            True, type="boolean", description="Report what cleanup would delete; delete nothing."
        ),
        "stores_per_task": Param(
            200, type="integer", minimum=1, description="Due stores per mapped snapshot task."
        ),
    },
) as dag:
    due = StateDueStoresOperator(
        task_id="due_stores",
        checkpoint_roots="{{ params.roots }}",
        stores_per_task="{{ params.stores_per_task }}",
        map_index_template=None,
    )
    roots = StateRootsOperator(
        task_id="roots", checkpoint_roots="{{ params.roots }}", map_index_template=None
    )
    snapshots = StateSnapshotOperator.partial(task_id="snapshots").expand(stores=due.output)

    @task_group(group_id="root")
    def maintain_root(root: str) -> None:
        """Validation, cleanup gated on it, and health, for one checkpoint root."""
        validate = StateValidationOperator(
            task_id="validate", checkpoint_roots=root, trigger_rule="all_done"
        )
        cleanup = StateCleanupOperator(
            task_id="cleanup",
            checkpoint_roots=root,
            dry_run="{{ params.cleanup_dry_run "
            "and var.value.get('state_runtime_cleanup', 'dry-run') != 'execute' }}",
        )
        health = StateHealthCheckOperator(
            task_id="health", checkpoint_roots=root, trigger_rule="all_done", outlets=[MAINTAINED]
        )
        validate >> cleanup >> health

    snapshots >> maintain_root.expand(root=roots.output)
