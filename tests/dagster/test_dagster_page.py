"""The broken store's partition page in a real ``dagster dev``, as headless Chromium renders
it (the screenshot script's own browser), and as its GraphQL data says.

The issue's night: a stream's batch finds a file gone (the runtime records the loss on the
store; no validation runs), and within a minute the store failures sensor fails the store's
partition. Its page must show why (the status and reason as the latest metadata), no value of
its last sound materialization under the red "Run … failed" banner; and once the store is
sound again (the file back, a validation), the sensor's run on the partition clears the banner
with a fresh materialization. The server is ``dg dev``, as ``make dagster`` runs it: its console
shows the broken store's failure once, as its paragraph, with no traceback and no warning.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from scripts.dagster_dev import DagsterDev
from scripts.screenshot_dagster import Chromium
from state_runtime.catalog import Catalog
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.runtime.loss import lost_state
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream
from tests.services import service_missing

# Each server wait is bounded (scripts/dagster_dev.py, 150-300 s); on a loaded machine
# several run long in one test, so the whole-test bound leaves room for them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

EVENT = """timestamp runId metadataEntries { label ... on TextMetadataEntry { text } }"""
PARTITION = f"""query($key: AssetKeyInput!, $partition: String!) {{
    assetNodeOrError(assetKey: $key) {{ ... on AssetNode {{
    latestRunForPartition(partition: $partition) {{ id status }}
    assetMaterializations(partitions: [$partition]) {{ {EVENT} }}
    assetObservations(partitions: [$partition]) {{ {EVENT} }} }} }} }}"""
BANNER = "failed, and did not materialize"


def partition_page(server: DagsterDev, partition: str) -> dict[str, Any]:
    """What the partition's page is built from: its latest run (a failed one is the red
    banner), and the metadata it shows: the latest materialization's, each value replaced by
    the observations that followed it ("Observed in run ..."); ``stale`` names the values
    still the materialization's."""
    node = server.graphql(PARTITION, key={"path": ["state_checkpoints"]}, partition=partition)[
        "assetNodeOrError"
    ]
    latest = max(node["assetMaterializations"], key=lambda e: float(e["timestamp"]))
    later = [
        o for o in node["assetObservations"] if float(o["timestamp"]) > float(latest["timestamp"])
    ]
    shown: dict[str, tuple[str | None, str]] = {}
    for event in [latest, *sorted(later, key=lambda e: float(e["timestamp"]))]:
        for entry in event["metadataEntries"]:
            shown[entry["label"]] = (entry.get("text"), event["runId"])
    return {
        "run": node["latestRunForPartition"],
        "metadata": {label: text for label, (text, _) in shown.items()},
        "stale": sorted(label for label, (_, run) in shown.items() if run == latest["runId"]),
    }


def test_the_broken_partition_page_says_why_and_clears_once_sound(tmp_path: Path) -> None:
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        service_missing("chromium", "apt-get install chromium")
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    storage = LocalStorage(tmp_path / "checkpoint")
    with Catalog.open(url, upgrade=True) as catalog:
        stores = [StoreId(0, p) for p in range(3)]
        stream = StoreStream(catalog, storage, stores)
        stream.run(4)
        victim = stores[1]
        broken = f"query-1/{victim}"
        server = DagsterDev(tmp_path / "dagster_home", {"STATE_CATALOG_URL": url}, dg=True)
        with server:
            server.wait_loaded()
            server.graphql("mutation { setNuxSeen }")  # no "join the community" dialog
            server.wait_partitions(len(stores))
            assert server.wait_run(server.launch("state_validation_job")) == "SUCCESS"

            # a batch finds a delta gone: the runtime records the loss, nothing validates
            latest = stream.committed[victim][-1]
            lost = stream.committed[victim][2]
            content = (storage.root / lost.path).read_bytes()
            (storage.root / lost.path).unlink()
            base = CheckpointRef(latest.version, latest.checkpoint_id)
            assert (
                lost_state(
                    catalog, storage, "query-1", 4, {victim: base}, RuntimeError("a task failed")
                )
                is not None
            )
            server.wait_failed("state_checkpoints", broken)  # the failures sensor's run
            page = partition_page(server, broken)
            assert page["run"]["status"] == "FAILURE"
            assert page["metadata"]["status"] == "broken"
            assert lost.path in page["metadata"]["status_reason"]
            assert page["stale"] == []  # no value of the last sound materialization
            assert "status_since" in page["metadata"]  # since when, as health says

            browser = Chromium(tmp_path / "chromium-profile")
            address = f"{server.url}/assets/state_checkpoints?view=partitions&partition="
            try:
                shown = browser.screenshot(
                    address + quote(broken, safe=""),
                    tmp_path / "b.png",
                    showing=[BANNER, lost.path, "status_since"],
                )
                assert BANNER in shown and "broken" in shown and lost.path in shown
                assert "healthy" not in shown and "status_since" in shown

                # sound again: the sensor's run on the partition materializes it
                (storage.root / lost.path).write_bytes(content)
                assert server.wait_run(server.launch("state_validation_job")) == "SUCCESS"
                server.wait_until(
                    lambda: partition_page(server, broken)["run"]["status"] == "SUCCESS"
                )
                assert server.partition_statuses("state_checkpoints")[broken] == "materialized"
                shown = browser.screenshot(
                    address + quote(broken, safe=""), tmp_path / "s.png", showing=["healthy"]
                )
                assert BANNER not in shown and "healthy" in shown
            finally:
                browser.close()
            assert not server.stop()
        console = server.log.read_text(errors="replace")
        assert "Traceback" not in console and "Stack Trace" not in console
        assert "Warning" not in console
        # the failure sensor's run on the broken partition: its failure once, as its paragraph
        [why] = [line for line in console.splitlines() if line.startswith("broken since ")]
        assert lost.path in why
