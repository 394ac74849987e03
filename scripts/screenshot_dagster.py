"""Screenshots of the Dagster UI for the docs: the asset graph and store-health plots.

    .venv/bin/python scripts/screenshot_dagster.py            # writes docs/dagster-*.png

A real stream (the runtime on Spark, ``local[2]``) keeps running totals per user in four
state stores; between rounds of micro-batches, ``dagster dev`` (started here, in its own
process group, with a temporary DAGSTER_HOME) runs the health and validation job and, every
other round, the snapshot job, so the plots have a history. Headless Chromium, driven over
the DevTools protocol (to switch the metadata view to plots), captures the pages. Needs
``chromium`` on PATH (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.dagster_dev import REPO, DagsterDev
from state_runtime.catalog import Catalog
from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
from state_runtime.runtime.session import spark_session

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
CLICK = """(() => { const found = [...document.querySelectorAll('button')]
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
        self, url: str, target: Path, *, click: str | None = None, scroll_to: str | None = None
    ) -> None:
        asyncio.run(self._screenshot(url, target, click, scroll_to))
        print(f"wrote {target}")

    async def _screenshot(
        self, url: str, target: Path, click: str | None, scroll_to: str | None
    ) -> None:
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
            await call("Page.navigate", url=url)
            await asyncio.sleep(15)  # the UI loads its data in several rounds
            for text, script in ((click, CLICK), (scroll_to, SCROLL)):
                if text is not None:
                    await call("Runtime.evaluate", expression=script % json.dumps(text))
                    await asyncio.sleep(3)
            shot = await call("Page.captureScreenshot", format="png")
            target.write_bytes(base64.b64decode(shot["data"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches-per-round", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dagster-screenshots-"))
    url = f"sqlite:///{work / 'catalog.db'}"
    spark = spark_session("local[2]", app_name="dagster-screenshots", shuffle_partitions=4)
    op = running_aggregation(
        0, ["user"], "user string", [Agg("clicks", "count"), Agg("amount", "sum", "amount")], 4
    )
    query = StatefulQuery("clicks_per_user", str(work / "checkpoint"), [op], catalog_url=url)
    rng = random.Random(1)
    env = {"STATE_CATALOG_URL": url, "STATE_MAINTENANCE_SNAPSHOT_MIN_DELTAS": "5"}
    try:
        with Catalog.open(url, upgrade=True), DagsterDev(work / "dagster_home", env) as server:
            server.wait_loaded()
            server.graphql("mutation { setNuxSeen }")  # no "join the community" dialog
            batch = 0
            for round_ in range(args.rounds):
                for _ in range(args.batches_per_round):
                    events = [
                        (f"user{rng.randrange(5000)}", rng.randrange(100)) for _ in range(4000)
                    ]
                    df = spark.createDataFrame(events, "user string, amount bigint")
                    query.run_batch(df, batch).release()
                    batch += 1
                jobs = ["state_validation_job"] + (
                    ["state_snapshot_job"] if round_ % 3 == 2 else []
                )
                for job in jobs:
                    status = server.wait_run(server.launch(job))
                    print(f"round {round_ + 1}: batch {batch}, {job} {status}", flush=True)
                    if status != "SUCCESS":
                        raise SystemExit(f"{job} ended {status}:\n{server.tail(6000)}")
            browser = Chromium(work / "chromium-profile")
            try:
                browser.screenshot(
                    server.url + "/asset-groups/state_maintenance",
                    args.out / "dagster-asset-graph.png",
                )
                browser.screenshot(
                    server.url + "/assets/state_store_health",
                    args.out / "dagster-health-plot.png",
                    click="Plots",
                    scroll_to="Metadata",
                )
                browser.screenshot(
                    f"{server.url}/assets/state_checkpoints?view=checks",
                    args.out / "dagster-checks.png",
                )
            finally:
                browser.close()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
