"""Airflow's DAG-integrity conventions for the provider's DAG folder: it parses with no import
error, does no work when parsed (no catalog, no storage, no network), its DAG is paused when
created and runs no destructive pass by default; the provider registers with Airflow."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.airflow.conftest import DAGS, REPO

DAG_ID = "state_store_maintenance"


def test_the_dag_folder_parses_without_import_errors() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert set(bag.dags) == {
        DAG_ID,
        "state_store_repair",
        "state_store_restore",
        "state_store_repartition",
    }
    # Nothing runs until an operator unpauses a DAG; what rewrites or deletes is a dry run
    # unless a run says otherwise; repair and restore run only when triggered.
    assert all(d.is_paused_upon_creation for d in bag.dags.values())
    for name in ("state_store_repair", "state_store_restore", "state_store_repartition"):
        assert bag.dags[name].schedule is None
        assert bag.dags[name].params["dry_run"] is True
    dag = bag.dags[DAG_ID]
    assert dag.is_paused_upon_creation is True
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.params["cleanup_dry_run"] is True
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {
        "due_stores",
        "roots",
        "snapshots",
        "root.validate",
        "root.cleanup",
        "root.health",
    }
    # Mapped: one snapshot task per group of due stores, one group of tasks per root.
    assert {t.task_id for t in dag.tasks if t.is_mapped} >= {"snapshots"}
    # Cleanup runs only after validation succeeded; health runs whatever happened before.
    assert "root.validate" in tasks["root.cleanup"].upstream_task_ids
    assert tasks["root.cleanup"].trigger_rule == "all_success"
    assert tasks["root.health"].trigger_rule == "all_done"
    assert "snapshots" in tasks["root.validate"].upstream_task_ids


def test_parsing_the_dag_does_no_work() -> None:
    """Parsed in a fresh interpreter where opening the catalog, a storage or a socket raises:
    the DAG still loads, so the parser never touches them."""
    script = textwrap.dedent(
        f"""
        import socket
        import state_runtime.catalog, state_runtime.storage

        def refuse(*args, **kwargs):
            raise RuntimeError("work at parse time")

        state_runtime.catalog.Catalog.open = refuse
        state_runtime.storage.open_storage = refuse
        socket.socket.connect = refuse
        socket.create_connection = refuse

        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(DAGS)!r})
        assert bag.import_errors == {{}}, bag.import_errors
        assert {DAG_ID!r} in bag.dags
        print("parsed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "parsed" in done.stdout


def test_the_provider_registers_its_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from state_runtime_airflow.provider_info import get_provider_info

    manager = ProvidersManager()
    assert "state-runtime" in manager.providers
    assert manager.providers["state-runtime"].data["name"] == get_provider_info()["name"]
    hook = ProvidersManagerTaskRuntime().hooks["state_catalog"]
    assert hook is not None
    assert hook.hook_class_name == "state_runtime_airflow.hooks.StateCatalogHook"
