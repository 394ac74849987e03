"""Screenshots of the Dagster UI for the docs, from a real ``dagster dev`` on demo stores.

    .venv/bin/python scripts/screenshot_dagster.py      # writes docs/dagster-*.png

Runs the demo (``python -m demo``) into a temporary folder with its own catalog (your
``demo-output`` is left alone: the script breaks a store), then Dagster on that
catalog (``dagster dev -w workspace.yaml`` in its own process group, a temporary DAGSTER_HOME,
a free port) with the demo policy in
the environment (``STATE_MAINTENANCE_*``: no retention window, snapshots after 2 deltas). It
waits until the discovery sensor has added a partition per store, runs a few rounds of
maintenance jobs through GraphQL (validation; snapshots; cleanup with ``dry_run: false``) so
that each store's partition has a history, waits for the catalog sensor's batch metrics, then
deletes one delta of one store and validates again, and waits until the store failures
sensor has failed its partition: the broken store's truth. Headless
Chromium, driven over the DevTools protocol, captures the pages; the process group of
``dagster dev`` is stopped at the end. Needs ``chromium`` on PATH (Debian: ``apt-get install
chromium``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.dagster_dev import REPO, DagsterDev
from state_runtime.catalog import Catalog
from state_runtime.maintenance import StoreNames

LOAD_S = 180
"""Seconds a screenshot waits for the text it expects to show (a loaded machine is slow)."""
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]
CLICK = """(() => { const found = [...document.querySelectorAll('button, a, [role=tab]')]
  .filter(b => b.textContent.trim() === %s);
  found.forEach(b => b.click()); return found.length })()"""
SCROLL = """(() => { const found = [...document.querySelectorAll('*')]
  .find(e => e.children.length === 0 && e.textContent.trim() === %s);
  if (found) found.scrollIntoView(); return !!found })()"""


class Chromium:
    """Headless Chromium with a fresh profile, driven over the DevTools protocol."""

    def __init__(self, profile: Path, width: int = 1600, height: int = 1100) -> None:
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is None:
            raise SystemExit("chromium not found: apt-get install chromium")
        self.size = (width, height)
        self.process = subprocess.Popen(
            [
                browser,
                *CHROMIUM_FLAGS,
                f"--window-size={width},{height}",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        self.page_url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def screenshot(
        self,
        url: str,
        target: Path,
        *,
        click: str | None = None,
        scroll_to: str | None = None,
        showing: Sequence[str] = (),
    ) -> str:
        """Captures the page at ``url`` into ``target``; the page's text (what a test reads).

        With ``showing``, captures once the page's text holds each of those (the UI loads its
        data in several rounds; at most :data:`LOAD_S` seconds), else after a fixed wait."""
        text = asyncio.run(self._screenshot(url, target, click, scroll_to, showing))
        print(f"wrote {target}")
        return text

    async def _screenshot(
        self,
        url: str,
        target: Path,
        click: str | None,
        scroll_to: str | None,
        showing: Sequence[str],
    ) -> str:
        async with websockets.connect(self.page_url, max_size=100_000_000) as ws:
            counter = 0

            async def call(method: str, **params: Any) -> dict[str, Any]:
                nonlocal counter
                counter += 1
                await ws.send(json.dumps({"id": counter, "method": method, "params": params}))
                while True:
                    message = json.loads(await ws.recv())
                    if message.get("id") == counter:
                        return dict(message.get("result", {}))

            width, height = self.size
            await call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )

            async def page_text() -> str:
                text = await call("Runtime.evaluate", expression="document.body.innerText")
                return str(text["result"].get("value", ""))

            await call("Page.navigate", url=url)
            if not showing:
                await asyncio.sleep(15)  # the UI loads its data in several rounds
            deadline = time.monotonic() + LOAD_S
            while showing and time.monotonic() < deadline:
                shown = await page_text()
                if all(expected in shown for expected in showing):
                    break
                await asyncio.sleep(1)
            for text, script in ((click, CLICK), (scroll_to, SCROLL)):
                if text is not None:
                    await call("Runtime.evaluate", expression=script % json.dumps(text))
                    await asyncio.sleep(3)
            shot = await call("Page.captureScreenshot", format="png")
            target.write_bytes(base64.b64decode(shot["data"]))
            return await page_text()


DEMO_POLICY = {
    "STATE_MAINTENANCE_SNAPSHOT_MIN_DELTAS": "2",
    "STATE_MAINTENANCE_WINDOW": "0s",
    "STATE_MAINTENANCE_ORPHAN_GRACE": "0s",
    "STATE_MAINTENANCE_MIN_WINDOW": "0s",
}
CLEANUP = {"ops": {"state_retention_cleanup": {"config": {"dry_run": False}}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dagster-screenshots-"))
    demo = work / "demo-output"
    url = f"sqlite:///{demo / 'catalog.db'}"
    subprocess.run(
        [sys.executable, "-m", "demo", "--output", str(demo), "--batches", "8"],
        cwd=REPO,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("STATE_")},
    )
    with Catalog.open(url) as catalog:
        records = catalog.stores()
        names = StoreNames.of(catalog)
    env = {"STATE_CATALOG_URL": url} | DEMO_POLICY
    try:
        with DagsterDev(work / "dagster_home", env) as server:
            server.wait_loaded()
            server.graphql("mutation { setNuxSeen }")  # no "join the community" dialog
            keys = server.wait_partitions(len(records))
            rounds = [["state_validation_job", "state_snapshot_job"]]
            rounds += [["state_validation_job", "state_cleanup_job"]]
            rounds += [["state_validation_job"]] * max(1, args.rounds - 2)
            for number, jobs in enumerate(rounds, 1):
                for job in jobs:
                    config = CLEANUP if job == "state_cleanup_job" else None
                    status = server.wait_run(server.launch(job, config))
                    print(f"round {number}: {job} {status}", flush=True)
                    if status != "SUCCESS":
                        raise SystemExit(f"{job} ended {status}:\n{server.tail(6000)}")
                time.sleep(5)  # the next health run sees a longer commit lag
            server.wait_materialized("state_batch_metrics")  # the catalog sensor's report
            victim = records[-1]
            with Catalog.open(url) as catalog:
                files = catalog.store_files(victim.key.root, victim.key.store)
            newest = max((f for f in files if f.kind.value == "delta"), key=lambda f: f.version)
            (Path(victim.key.root.removeprefix("file://")) / newest.path).unlink()
            status = server.wait_run(server.launch("state_validation_job"))
            print(f"broke {names.name(victim.key)}: state_validation_job {status}", flush=True)
            server.wait_failed("state_checkpoints", names.name(victim.key))  # the sensor's run
            browser = Chromium(work / "chromium-profile")
            store = quote(sorted(keys)[0], safe="")
            broken = quote(names.name(victim.key), safe="")
            pages = [
                ("/asset-groups/state_maintenance", "dagster-asset-graph.png", None, None),
                (
                    f"/assets/state_checkpoints?view=partitions&partition={broken}",
                    "dagster-broken-store.png",
                    None,
                    None,
                ),
                ("/assets/state_batch_metrics", "dagster-batch-metrics.png", "Plots", "Metadata"),
                ("/assets/state_store_health", "dagster-health-plot.png", "Plots", "Metadata"),
                ("/assets/state_checkpoints?view=checks", "dagster-checks.png", None, None),
                (
                    f"/assets/state_checkpoints?view=partitions&partition={store}",
                    "dagster-store-partition.png",
                    None,
                    None,
                ),
                (
                    "/assets/state_checkpoints",
                    "dagster-store-plots.png",
                    "Plots",
                    "Metadata",
                ),
                (
                    f"/assets/state_checkpoints?view=events&partition={store}",
                    "dagster-store-events.png",
                    None,
                    None,
                ),
            ]
            try:
                for page, name, click, scroll_to in pages:
                    browser.screenshot(
                        server.url + page, args.out / name, click=click, scroll_to=scroll_to
                    )
            finally:
                browser.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
