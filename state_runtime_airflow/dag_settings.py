"""What every provider DAG shares: paused when created, one run at a time, no catchup, native
template rendering (so a conf's booleans and numbers reach the operators as such); and the
shape of the DAGs run by hand on one stopped query."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param

from state_runtime_airflow.operators import StateHealthCheckOperator, StateQueryOperator


def maintenance_dag(
    dag_id: str,
    description: str,
    doc_md: str | None,
    params: Mapping[str, Param],
    schedule: str | None = None,
) -> DAG:
    """A provider DAG (``schedule=None``: run only when triggered)."""
    settings: dict[str, Any] = {
        "start_date": datetime(2025, 1, 1),
        "catchup": False,
        "is_paused_upon_creation": True,
        "max_active_runs": 1,
        "render_template_as_native_obj": True,
        "tags": ["state_runtime", "maintenance"],
    }
    return DAG(
        dag_id=dag_id,
        description=description,
        doc_md=doc_md,
        schedule=schedule,
        params=dict(params),
        **settings,
    )


def query_dag(
    dag_id: str,
    description: str,
    doc_md: str | None,
    *,
    task_id: str,
    operator: type[StateQueryOperator],
    params: Mapping[str, Param],
    dry_run: str,
) -> DAG:
    """A DAG run only when triggered, on one stopped query: task ``task_id`` (``operator``,
    each param passed as its argument of the same name; a dry run unless the conf says
    ``"dry_run": false``), then **health** on the query's root.

    Its params: ``root``, ``query_id``, ``spark_checkpoint``, then ``params`` (the
    operator's own), then ``dry_run`` (described by ``dry_run``).
    """
    every = {
        "root": Param("", type="string", minLength=1, description="The query's checkpoint root."),
        "query_id": Param("", type="string", minLength=1, description="The query."),
        "spark_checkpoint": Param(
            "", type="string", description="The query's Spark checkpoint folder; '' for none."
        ),
        **params,
        "dry_run": Param(True, type="boolean", description=dry_run),
    }
    with maintenance_dag(dag_id, description, doc_md, every) as dag:
        work = operator(
            task_id=task_id,
            map_index_template=None,
            **{name: f"{{{{ params.{name} }}}}" for name in every},
        )
        health = StateHealthCheckOperator(
            task_id="health", checkpoint_roots="{{ params.root }}", map_index_template=None
        )
        work >> health
    return dag
