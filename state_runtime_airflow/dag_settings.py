"""What every provider DAG shares: paused when created, one run at a time, no catchup, native
template rendering (so a conf's booleans and numbers reach the operators as such)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param


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
