"""Smoke test: ``dagster dev`` and ``dg dev`` serve the code location; a run launched over
GraphQL succeeds.

Starts ``dagster dev -w workspace.yaml`` (or ``dg dev``, from the project's ``[tool.dg]``) on a
free port in its own process group, with
DAGSTER_HOME in a temporary folder and the state catalog a fresh SQLite file holding real
stores; lists the assets and checks through GraphQL, launches the validation job, waits for
it to succeed, then stops the whole process group and checks that no process is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.dagster_dev import REPO, DagsterDev, group_members
from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream

# Each server wait is bounded (scripts/dagster_dev.py, 150-300 s); on a loaded machine
# several run long in one test, so the whole-test bound leaves room for them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
STATESTORE = "import sys; from state_runtime.cli import entry; sys.argv[0] = 'statestore'; entry()"

ASSETS = """{ assetNodes { assetKey { path } assetChecksOrError {
    ... on AssetChecks { checks { name } } } } }"""


@pytest.mark.parametrize("dg", [False, True], ids=["dagster-dev", "dg-dev"])
def test_dagster_dev_lists_the_definitions_and_runs_a_job(tmp_path: Path, dg: bool) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with Catalog.open(url, upgrade=True) as catalog:
        stores = [StoreId(0, p) for p in range(3)]
        StoreStream(catalog, LocalStorage(tmp_path / "checkpoint"), stores).run(4)
        server = DagsterDev(tmp_path / "dagster_home", {"STATE_CATALOG_URL": url}, dg=dg)
        with server:
            pgid = server.process.pid if server.process else 0
            server.wait_loaded()
            assets = {
                "/".join(node["assetKey"]["path"]): node
                for node in server.graphql(ASSETS)["assetNodes"]
            }
            assert set(assets) == {
                "state_checkpoints",
                "state_snapshots",
                "state_retention_cleanup",
                "state_snapshot_repair",
                "state_store_health",
                "state_reconciliation",
                "state_batch_metrics",
            }
            checks = assets["state_checkpoints"]["assetChecksOrError"]["checks"]
            assert {c["name"] for c in checks} == {
                "lineage_valid",
                "retention_within_policy",
                "snapshot_lag",
                "orphan_growth",
                "store_status",
                "commit_lag",
            }
            run_id = server.launch("state_validation_job")
            assert server.wait_run(run_id) == "SUCCESS", server.tail()
            leftover = server.stop()
        assert pgid and not leftover and not group_members(pgid)
        assert not server.forced, "dagster dev did not stop on Ctrl-C within a minute"
        runs = [r for r in catalog.recent_runs() if r.kind == "validate"]
        assert runs and runs[0].outcome == "succeeded" and runs[0].owner == f"dagster:{run_id}"
        assert runs[0].counts["stores"] == 3 and runs[0].counts["errors"] == 0


EVENT = """partition runId timestamp description metadataEntries {
    label ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } }"""
RECORDED = f"""query($key: AssetKeyInput!) {{ assetOrError(assetKey: $key) {{ ... on Asset {{
    assetMaterializations(limit: 200) {{ {EVENT} }} assetObservations(limit: 200) {{ {EVENT} }}
    }} }} }}"""
CHECK_EXECUTIONS = """query($key: AssetKeyInput!, $name: String!) {
    assetCheckExecutions(assetKey: $key, checkName: $name, limit: 100) {
    runId partition status evaluation { success severity description } } }"""
REPORT_JOB = "state_catalog_report_job"
ENDED = {"SUCCESS", "FAILURE", "CANCELED"}  # a run's status once it ended


def _latest(server: DagsterDev, asset: str) -> dict[str | None, dict[str, Any]]:
    """Each partition's latest recorded state (None: unpartitioned), a materialization or an
    observation (a broken store's): run id, description and its text and int metadata,
    through GraphQL."""
    found = server.graphql(RECORDED, key={"path": [asset]})["assetOrError"]
    events = found["assetMaterializations"] + found["assetObservations"]
    latest: dict[str | None, dict[str, Any]] = {}
    for event in sorted(events, key=lambda e: float(e["timestamp"])):
        entries = {e["label"]: e.get("text", e.get("intValue")) for e in event["metadataEntries"]}
        latest[event["partition"]] = entries | {
            "run": event["runId"],
            "description": event["description"],
        }
    return latest


def _statuses(server: DagsterDev) -> dict[str | None, str]:
    return {p: m["status"] for p, m in _latest(server, "state_checkpoints").items()}


def _executions(server: DagsterDev, check: str) -> list[dict[str, Any]]:
    """The check's executions, newest first: the first is what the check's page shows."""
    found: list[dict[str, Any]] = server.graphql(
        CHECK_EXECUTIONS, key={"path": ["state_checkpoints"]}, name=check
    )["assetCheckExecutions"]
    return found


def _evaluated(server: DagsterDev, check: str) -> list[dict[str, Any]]:
    """The check's evaluations, newest first (without the executions a run planned for a
    partitioned check as a whole, which carry no evaluation)."""
    return [e for e in _executions(server, check) if e["evaluation"] is not None]


def test_dagster_dev_tells_the_truth_about_a_broken_store_whoever_validates(
    tmp_path: Path,
) -> None:
    """Before anything ran, the stores are unknown (warnings, no green); after a validation
    from the CLI, reported by the catalog sensor, exactly the broken store is broken on its
    partition and its check, the others healthy, and exactly its partition shows Failed; the
    validation job in Dagster, whose blocking check fails, finds the same: the fleet's totals
    and the check's headline (the broken store) recorded, the unchanged states not again."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    storage = LocalStorage(tmp_path / "checkpoint")
    with Catalog.open(url, upgrade=True) as catalog:
        stores = [StoreId(0, p) for p in range(3)]
        stream = StoreStream(catalog, storage, stores)
        stream.run(4)
        names = {s: f"query-1/{s}" for s in stores}
        broken = stores[1]
        env = {"STATE_CATALOG_URL": url}
        with DagsterDev(tmp_path / "dagster_home", env) as server:
            server.wait_loaded()
            assert sorted(server.wait_partitions(3)) == sorted(names.values())
            # the catalog sensor's report of the stores' state (a run per report)
            unknown = dict.fromkeys(names.values(), "unknown")
            server.wait_until(lambda: _statuses(server) == unknown)
            # its checks are logged after the states: the run may still be logging them
            server.wait_until(
                lambda: (
                    {e["partition"] for e in _evaluated(server, "store_status")}
                    == set(names.values())
                )
            )
            status = _evaluated(server, "store_status")
            assert not any(e["evaluation"]["success"] for e in status)  # no green before

            lost = stream.committed[broken][2]
            (storage.root / lost.path).unlink()
            cli = subprocess.run(
                [sys.executable, "-c", STATESTORE, "--catalog-url", url, "-q", "validate"],
                capture_output=True,
                text=True,
                cwd=REPO,  # this checkout's code, as dagster dev runs it
                env={k: v for k, v in os.environ.items() if not k.startswith("STATE_")},
            )
            assert cli.returncode != 0 and lost.path in cli.stdout + cli.stderr
            [cli_run] = [r for r in catalog.recent_runs() if r.kind == "validate"]
            truth = {names[s]: "broken" if s == broken else "healthy" for s in stores}
            by_cli = f"validate run {cli_run.run_id} by {cli_run.owner}"

            def reported() -> bool:
                """The CLI's run reported: its checks by its report, every report run ended
                (the checks below read them), and each store's state, whichever run logged it
                last (a report queued before the validation, the failures sensor's run), true
                and naming the validation."""
                [lineage, *_] = _evaluated(server, "lineage_valid") or [None]
                if lineage is None or by_cli not in lineage["evaluation"]["description"]:
                    return False
                if any(r["status"] not in ENDED for r in server.job_runs(REPORT_JOB)):
                    return False
                latest = _latest(server, "state_checkpoints")
                return {p: m["status"] for p, m in latest.items()} == truth and all(
                    by_cli in m["description"] for m in latest.values()
                )

            server.wait_until(reported)
            assert not [r for r in server.job_runs(REPORT_JOB) if r["status"] == "FAILURE"]
            # the state_store_failures sensor fails exactly the broken store's partition
            failed = {names[s]: "failed" if s == broken else "materialized" for s in stores}
            server.wait_until(lambda: server.partition_statuses("state_checkpoints") == failed)
            [lineage, *_] = _evaluated(server, "lineage_valid")
            assert not lineage["evaluation"]["success"]
            assert lineage["evaluation"]["severity"] == "ERROR"
            assert lost.path in lineage["evaluation"]["description"]
            [latest_status, *_] = _evaluated(server, "store_status")
            assert _executions(server, "store_status")[0]["status"] != "SUCCEEDED"
            assert latest_status["partition"] == names[broken]  # the check's headline
            assert latest_status["evaluation"]["severity"] == "ERROR"

            run_id = server.launch("state_validation_job")
            assert server.wait_run(run_id) == "FAILURE"  # the blocking check failed its step
            in_dagster = _latest(server, "state_checkpoints")
            # nothing changed since the report: the states stand, not recorded again
            assert {p: m["status"] for p, m in in_dagster.items()} == truth
            assert all(m["run"] != run_id for m in in_dagster.values())
            assert in_dagster[names[broken]]["live_size"].endswith("B")
            fleet = _latest(server, "state_store_health")[None]
            assert fleet["run"] == run_id and fleet["broken_stores"] == 1
            by_partition: dict[str, dict[str, Any]] = {}
            for execution in reversed(_evaluated(server, "store_status")):
                by_partition[execution["partition"]] = execution
            assert {p: e["evaluation"]["success"] for p, e in by_partition.items()} == {
                names[s]: s != broken for s in stores
            }
            assert by_partition[names[broken]]["runId"] == run_id  # the headline, every pass
            assert server.partition_statuses("state_checkpoints") == failed  # still Failed
            leftover = server.stop()
        assert not leftover
