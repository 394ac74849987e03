"""Dagster's current tooling works on the project: ``dg check defs`` and ``dg list defs``
load the code location from ``[tool.dg]`` in pyproject.toml (``dg dev`` serves the same)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def dg(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATE_", "DAGSTER_"))}
    env |= {"VIRTUAL_ENV": str(VENV_BIN.parent), "PATH": f"{VENV_BIN}:{env.get('PATH', '')}"}
    return subprocess.run(
        [str(VENV_BIN / "dg"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_dg_checks_and_lists_the_definitions() -> None:
    checked = dg("check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    listed = dg("list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assets = {a["asset_key"] for a in defs["assets"]}
    assert {"state_checkpoints", "state_store_health", "state_retention_cleanup"} <= assets
    assert {j["name"] for j in defs["jobs"]} >= {"state_validation_job", "state_cleanup_job"}
