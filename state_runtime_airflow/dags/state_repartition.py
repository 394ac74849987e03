"""
### State store repartition

Run by hand with the query to repartition (no schedule; paused when created): **repartition**
changes a stopped query's number of state partitions below `root` to `num_partitions` (every
operator, or `operator_id` alone), on the query's last committed batch: a Spark job routes
every key with the runtime's rule and writes one snapshot per new partition, and one catalog
transaction switches the layout, so the query restarts with `num_partitions=N`. Refused, with
nothing written, while the query runs or a store has an open problem, or when the Spark
checkpoint (`spark_checkpoint`; `""` when it has none) has not committed that batch. A dry run
(rows and bytes per new partition, the skew) unless the conf says `"apply_changes": true`.
Then **health**. See docs/repartition.md and docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import Param

from state_runtime_airflow.dag_settings import maintenance_dag
from state_runtime_airflow.operators import StateHealthCheckOperator, StateRepartitionOperator

with maintenance_dag(
    "state_store_repartition",
    "Change a stopped query's number of state partitions",
    __doc__,
    schedule=None,
    params={
        "root": Param("", type="string", minLength=1, description="The query's checkpoint root."),
        "query_id": Param("", type="string", minLength=1, description="The query."),
        "num_partitions": Param(
            1, type="integer", minimum=1, description="The new number of state partitions."
        ),
        "operator_id": Param(
            None, type=["null", "integer"], description="Only this operator; empty for all."
        ),
        "spark_checkpoint": Param(
            "", type="string", description="The query's Spark checkpoint folder; '' for none."
        ),
        "master": Param("local[2]", type="string", description="The Spark master of the job."),
        "idle_seconds": Param(
            60, type="integer", minimum=0, description="Refuse if a batch committed this recently."
        ),
        "apply_changes": Param(False, type="boolean", description="Repartition; false plans only."),
    },
) as dag:
    repartition = StateRepartitionOperator(
        task_id="repartition",
        root="{{ params.root }}",
        query_id="{{ params.query_id }}",
        num_partitions="{{ params.num_partitions }}",
        operator_id="{{ params.operator_id }}",
        spark_checkpoint="{{ params.spark_checkpoint }}",
        master="{{ params.master }}",
        idle_seconds="{{ params.idle_seconds }}",
        apply_changes="{{ params.apply_changes }}",
        map_index_template=None,
    )
    health = StateHealthCheckOperator(
        task_id="health", checkpoint_roots="{{ params.root }}", map_index_template=None
    )
    repartition >> health
