"""
### State store repair

Run by hand (no schedule; paused when created): **repair** rebuilds the damaged snapshots
from their intact deltas (a dry run listing them unless the run's conf says
`{"dry_run": false}`), then **validate** and **health** say whether the stores are
whole again. A problem repair cannot fix (a lost delta) needs `statestore restore` or the
`state_store_restore` DAG. See docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param

from state_runtime_airflow.dag_settings import maintenance_dag
from state_runtime_airflow.operators import (
    StateHealthCheckOperator,
    StateRepairOperator,
    StateValidationOperator,
)

with maintenance_dag(
    "state_store_repair",
    "Rebuild damaged snapshots from their deltas, then validate",
    __doc__,
    schedule=None,
    params={
        "roots": Param([], type="array", description="Only these checkpoint roots; [] for all."),
        "dry_run": Param(
            True, type="boolean", description="List what would be rebuilt; false rebuilds."
        ),
    },
) as dag:
    scope = "{{ params.roots }}"
    repair = StateRepairOperator(
        task_id="repair",
        checkpoint_roots=scope,
        dry_run="{{ params.dry_run }}",
        map_index_template=None,
    )
    validate = StateValidationOperator(
        task_id="validate", checkpoint_roots=scope, trigger_rule="all_done", map_index_template=None
    )
    health = StateHealthCheckOperator(
        task_id="health", checkpoint_roots=scope, trigger_rule="all_done", map_index_template=None
    )
    repair >> validate >> health
