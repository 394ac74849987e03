"""Each setting is declared once; the environment reader, the CLI options and the docs follow
the declaration, and settings are read when used."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from state_runtime.catalog import CatalogTimeouts
from state_runtime.cli import main
from state_runtime.cli.group import POLICY_OPTIONS
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.maintenance import MaintenancePolicy
from state_runtime.settings import CATALOG_TIMEOUTS, MAINTENANCE, WORKER, WorkerSettings

ROOT = Path(__file__).resolve().parent.parent


def test_the_policy_defaults_and_floors_are_the_declared_ones() -> None:
    policy = MaintenancePolicy()
    for setting in MAINTENANCE:
        assert policy.value(setting.name) == setting.default, setting.name
        duration = setting.kind == "duration"
        below = setting.floor - (timedelta(seconds=1) if duration else 1)
        if below >= (timedelta(0) if duration else 0):  # a value below the floor exists
            error = MaintenanceRefused if setting.refusal else InvalidArgument
            with pytest.raises(error, match=setting.name):
                policy.with_overrides({setting.name: below})


def test_every_declared_variable_is_read_and_parsed() -> None:
    texts = {"int": "7", "bytes": "512MiB", "duration": "2h"}
    values = {"int": 7, "bytes": 512 << 20, "duration": timedelta(hours=2)}
    environ = {s.env: texts[s.kind] for s in MAINTENANCE if s.name != "lag_error_deltas"}
    policy = MaintenancePolicy.from_env(environ)
    for setting in MAINTENANCE:
        if setting.name != "lag_error_deltas":
            assert policy.value(setting.name) == values[setting.kind], setting.name
    assert CatalogTimeouts.from_env({s.env: "2m" for s in CATALOG_TIMEOUTS}) == CatalogTimeouts(
        *[timedelta(minutes=2)] * len(CATALOG_TIMEOUTS.settings)
    )
    assert WorkerSettings.from_env({}) == WorkerSettings()
    assert WorkerSettings.from_env({"STATE_CACHE_BYTES": "1GiB"}) == WorkerSettings(
        cache_bytes=1 << 30
    )
    with pytest.raises(InvalidArgument, match="STATE_CACHE_BYTES='-1'"):
        WorkerSettings.from_env({"STATE_CACHE_BYTES": "-1"})
    # Copies are unloaded by the memory budget alone (no "versions behind" rule).
    assert {s.env for s in WORKER} == {"STATE_CACHE_BYTES"}


def test_the_cli_options_are_the_declared_ones() -> None:
    passes = [main.commands["maintain"], main.commands["validate"]]
    options = {p.name: p for command in passes for p in command.params}
    for setting in POLICY_OPTIONS:
        assert setting.name in options and setting.option in options[setting.name].opts
        assert options[setting.name].help == setting.help
    assert {s.option for s in POLICY_OPTIONS} == {
        "--min-deltas",
        "--retain-versions",
        "--window",
        "--orphan-grace",
        "--min-window",
        "--snapshots-per-run",
        "--workers",
        "--processes",
        "--verify-sample-percent",
    }


def test_the_docs_list_every_maintenance_variable_with_its_default() -> None:
    docs = (ROOT / "docs" / "maintenance.md").read_text()
    rows = [line for line in docs.splitlines() if line.startswith("| `STATE_MAINTENANCE_")]
    for setting in MAINTENANCE:
        short = "`_" + setting.env.removeprefix(MAINTENANCE.prefix) + "`"
        row = next((r for r in rows if f"`{setting.env}`" in r or short in r), None)
        assert row is not None, setting.env
        assert setting.text(setting.default) in row, (setting.env, row)


def test_worker_settings_are_not_read_at_import() -> None:
    """A bad variable fails where the value is used, never the import of the library."""
    code = (
        "import state_runtime, state_runtime.runtime, state_runtime.store.cache as c\n"
        "try:\n    c.CACHE.budget\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATE_")}
    env |= {"STATE_CACHE_BYTES": "lots"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "InvalidArgument [STATE_INVALID_ARGUMENT] STATE_CACHE_BYTES='lots'" in done.stdout, (
        done.stderr
    )
