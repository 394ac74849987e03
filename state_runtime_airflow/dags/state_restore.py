"""
### State store restore

Run by hand with the query to restore (no schedule; paused when created): **restore**
returns a stopped query's stores below `root` to batch `batch_id` and rewinds its Spark
checkpoint (`spark_checkpoint`; `""` when it has none). A dry run (the plan per store) unless
the conf says `"dry_run": false`; refused, naming the lost stores and the newest intact
batch, when a store's version does not load (unless `allow_lost_state`). Then **health**.
See docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param

from state_runtime_airflow.dag_settings import query_dag
from state_runtime_airflow.operators import StateRestoreOperator

dag = query_dag(
    "state_store_restore",
    "Return a stopped query's stores to an earlier, intact batch",
    __doc__,
    task_id="restore",
    operator=StateRestoreOperator,
    params={
        "batch_id": Param(0, type="integer", minimum=0, description="The batch to return to."),
        "allow_lost_state": Param(
            False, type="boolean", description="Restart stores that do not load from empty."
        ),
    },
    dry_run="Plan only; false restores.",
)
