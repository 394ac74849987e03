"""
### State store restore

Run by hand with the query to restore (no schedule; paused when created): **restore**
returns a stopped query's stores below `root` to batch `batch_id` and rewinds its Spark
checkpoint (`spark_checkpoint`; `""` when it has none). A dry run (the plan per store) unless
the conf says `"apply_changes": true`; refused, naming the lost stores and the newest intact
batch, when a store's version does not load (unless `allow_lost_state`). Then **health**.
See docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param

from state_runtime_airflow.dag_settings import maintenance_dag
from state_runtime_airflow.operators import StateHealthCheckOperator, StateRestoreOperator

with maintenance_dag(
    "state_store_restore",
    "Return a stopped query's stores to an earlier, intact batch",
    __doc__,
    schedule=None,
    params={
        "root": Param("", type="string", minLength=1, description="The query's checkpoint root."),
        "query_id": Param("", type="string", minLength=1, description="The query."),
        "batch_id": Param(0, type="integer", minimum=0, description="The batch to return to."),
        "spark_checkpoint": Param(
            "", type="string", description="The query's Spark checkpoint folder; '' for none."
        ),
        "allow_lost_state": Param(
            False, type="boolean", description="Restart stores that do not load from empty."
        ),
        "apply_changes": Param(False, type="boolean", description="Restore; false plans only."),
    },
) as dag:
    restore = StateRestoreOperator(
        task_id="restore",
        root="{{ params.root }}",
        query_id="{{ params.query_id }}",
        batch_id="{{ params.batch_id }}",
        spark_checkpoint="{{ params.spark_checkpoint }}",
        allow_lost_state="{{ params.allow_lost_state }}",
        apply_changes="{{ params.apply_changes }}",
        map_index_template=None,
    )
    health = StateHealthCheckOperator(
        task_id="health", checkpoint_roots="{{ params.root }}", map_index_template=None
    )
    restore >> health
