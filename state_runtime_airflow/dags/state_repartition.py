"""
### State store repartition

Run by hand with the query to repartition (no schedule; paused when created): **repartition**
changes a stopped query's number of state partitions below `root` to `num_partitions` (every
operator, or `operator_id` alone), on the query's last committed batch: a Spark job routes
every key with the runtime's rule and writes one snapshot per new partition, and one catalog
transaction switches the layout, so the query restarts with `num_partitions=N`. Refused, with
nothing written, while the query runs or a store has an open problem, or when the Spark
checkpoint (`spark_checkpoint`; `""` when it has none) has not committed that batch. A dry run
(rows and bytes per new partition, the skew) unless the conf says `"dry_run": false`.
Then **health**. See docs/repartition.md and docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param

from state_runtime_airflow.dag_settings import query_dag
from state_runtime_airflow.operators import StateRepartitionOperator

dag = query_dag(
    "state_store_repartition",
    "Change a stopped query's number of state partitions",
    __doc__,
    task_id="repartition",
    operator=StateRepartitionOperator,
    params={
        "num_partitions": Param(
            1, type="integer", minimum=1, description="The new number of state partitions."
        ),
        "operator_id": Param(
            None, type=["null", "integer"], description="Only this operator; empty for all."
        ),
        "master": Param("local[2]", type="string", description="The Spark master of the job."),
        "idle_seconds": Param(
            60, type="integer", minimum=0, description="Refuse if a batch committed this recently."
        ),
    },
    dry_run="Plan only; false repartitions.",
)
