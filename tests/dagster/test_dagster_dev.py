"""Smoke test: ``dagster dev`` and ``dg dev`` serve the code location; a run launched over
GraphQL succeeds.

Starts ``dagster dev -w workspace.yaml`` (or ``dg dev``, from the project's ``[tool.dg]``) on a
free port in its own process group, with
DAGSTER_HOME in a temporary folder and the state catalog a fresh SQLite file holding real
stores; lists the assets and checks through GraphQL, launches the validation job, waits for
it to succeed, then stops the whole process group and checks that no process is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.dagster_dev import DagsterDev, group_members
from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

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
