"""``dagster dev`` on the code location, driven from Python: start, GraphQL, launch, stop.

Used by the smoke test (tests/dagster/test_dagster_dev.py) and the screenshot script. The
server runs in its own process group; :meth:`DagsterDev.stop` sends Ctrl-C to the whole group
(what a terminal does), then SIGKILL to whatever is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
LOCATION = "state_maintenance"
DAGSTER = Path(sys.executable).with_name("dagster")
DG = Path(sys.executable).with_name("dg")

LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } } } }"""
RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""
PARTITIONS = """query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
    ... on AssetNode { partitionKeys } } }"""
JOB_RUNS = """query($job: String!) { runsOrError(filter: {pipelineName: $job}) {
    ... on Runs { results { runId status } } } }"""
MATERIALIZED = """query($key: AssetKeyInput!) { assetOrError(assetKey: $key) {
    ... on Asset { assetMaterializations(limit: 1) { timestamp } } } }"""
PARTITION_STATUS = """query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
    ... on AssetNode { partitionStats { numMaterialized numFailed }
    assetPartitionStatuses { ... on DefaultPartitionStatuses {
    materializedPartitions failedPartitions } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _default_signals() -> None:
    """Undo an inherited "ignore SIGINT/SIGTERM" (shells start background jobs that way), so
    that the server shuts down gracefully on Ctrl-C."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


class DagsterDev:
    """``dagster dev -w workspace.yaml`` with DAGSTER_HOME ``home`` and extra ``env``; with
    ``make``, the repository's ``make dagster`` (same home and port) instead; with ``dg``,
    ``dg dev`` (the project's ``[tool.dg]`` configuration, no workspace file)."""

    def __init__(
        self,
        home: Path,
        env: dict[str, str],
        port: int | None = None,
        *,
        make: bool = False,
        dg: bool = False,
    ) -> None:
        self.home = home
        self.make = make
        self.dg = dg
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "dagster-dev.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("STATE_", "DAGSTER_"))}
        self.env = base | env | {"DAGSTER_HOME": str(home)}
        self.process: subprocess.Popen[bytes] | None = None
        self.forced = False  # whether stop() had to SIGKILL

    def __enter__(self) -> DagsterDev:
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "dagster_project" / "dagster.yaml", self.home / "dagster.yaml")
        with self.log.open("wb") as out:
            if self.make:
                command = ["make", "dagster", f"DAGSTER_HOME={self.home}"]
                command.append(f"DAGSTER_PORT={self.port}")
            elif self.dg:
                command = [str(DG), "dev", "--host", "127.0.0.1", "--port", str(self.port)]
            else:
                command = [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1"]
                command += ["-p", str(self.port)]
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_default_signals,
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        response = requests.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables}, timeout=60
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        if "errors" in body:
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        data: dict[str, Any] = body["data"]
        return data

    def wait_loaded(self, timeout_s: float = 150) -> None:
        """Until the webserver answers and the code location has loaded without error."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited:\n{self.tail()}")
            try:
                entries = self.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
            except (requests.RequestException, RuntimeError):
                entries = []
            for entry in entries:
                if entry["name"] == LOCATION and entry["loadStatus"] == "LOADED":
                    kind = entry["locationOrLoadError"]["__typename"]
                    if kind != "RepositoryLocation":
                        raise RuntimeError(f"code location failed to load: {entry}")
                    return
            time.sleep(1)
        raise TimeoutError(f"dagster dev did not load in {timeout_s} s:\n{self.tail()}")

    def launch(self, job: str, run_config: dict[str, Any] | None = None) -> str:
        params = {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "jobName": job,
            },
            "runConfigData": run_config or {},
        }
        launched = self.graphql(LAUNCH, params=params)["launchRun"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"cannot launch {job}: {launched}")
        run_id: str = launched["run"]["runId"]
        return run_id

    def wait_run(self, run_id: str, timeout_s: float = 150) -> str:
        """The run's final status (SUCCESS, FAILURE or CANCELED)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status: str = self.graphql(RUN, id=run_id)["runOrError"]["status"]
            if status in {"SUCCESS", "FAILURE", "CANCELED"}:
                return status
            time.sleep(1)
        raise TimeoutError(f"run {run_id} did not finish in {timeout_s} s:\n{self.tail()}")

    def wait_partitions(self, count: int, timeout_s: float = 240) -> list[str]:
        """The store partitions, once the discovery sensor has added ``count`` of them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            node = self.graphql(PARTITIONS, key={"path": ["state_checkpoints"]})
            keys: list[str] = node["assetNodeOrError"].get("partitionKeys") or []
            if len(keys) >= count:
                return keys
            time.sleep(3)
        raise TimeoutError(f"the discovery sensor added no partitions:\n{self.tail()}")

    def wait_materialized(self, asset: str, timeout_s: float = 240) -> None:
        """Until ``asset`` has a materialization (a sensor's report, say)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.graphql(MATERIALIZED, key={"path": [asset]})["assetOrError"]
            if found.get("assetMaterializations"):
                return
            time.sleep(3)
        raise TimeoutError(f"{asset} was not materialized:\n{self.tail()}")

    def partition_statuses(self, asset: str) -> dict[str, str]:
        """Each partition's status as the partition view shows it, ``materialized`` or
        ``failed`` (its Failed filter counts ``numFailed``); partitions without either are
        left out."""
        found = self.graphql(PARTITION_STATUS, key={"path": [asset]})["assetNodeOrError"]
        shown = found["assetPartitionStatuses"]
        statuses = dict.fromkeys(shown["materializedPartitions"], "materialized")
        statuses |= dict.fromkeys(shown["failedPartitions"], "failed")
        if found["partitionStats"]["numFailed"] != len(shown["failedPartitions"]):
            raise AssertionError(f"{asset}: the Failed count disagrees with the partitions")
        return statuses

    def wait_failed(self, asset: str, partition: str, timeout_s: float = 240) -> None:
        """Until ``partition`` of ``asset`` shows Failed (the store failures sensor's run)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.partition_statuses(asset).get(partition) == "failed":
                return
            time.sleep(3)
        raise TimeoutError(f"{asset} {partition} did not fail:\n{self.tail()}")

    def wait_until(self, condition: Callable[[], bool], timeout_s: float = 300) -> None:
        """Until ``condition`` holds (the sensors tick every 30 to 60 s)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not reached in {timeout_s} s:\n{self.tail()}")
            time.sleep(3)

    def job_runs(self, job: str) -> list[dict[str, str]]:
        """The runs of ``job``, newest first (runId, status)."""
        runs: list[dict[str, str]] = self.graphql(JOB_RUNS, job=job)["runsOrError"]["results"]
        return runs

    def stop(self) -> list[int]:
        """Stop the whole process group; the processes still alive afterwards (none, normally)."""
        if self.process is None:
            return []
        pgid = self.process.pid
        os.killpg(pgid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if group_members(pgid):
            self.forced = True
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.process = None
        return group_members(pgid)
