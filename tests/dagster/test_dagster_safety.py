"""Dagster tells the same truth as the CLI and SQL, blocks cleanup on a failing lineage check,
repairs, and starts nothing that writes or deletes on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from dagster import AssetCheckKey, DagsterInstance, materialize

from dagster_project.definitions import defs
from dagster_project.defs.asset_checks import state_checkpoint_checks
from dagster_project.defs.assets import (
    state_checkpoints,
    state_retention_cleanup,
    state_snapshot_repair,
    state_snapshots,
    state_store_health,
)
from dagster_project.defs.store_events import HEALTH_KEY
from state_runtime.cli import main as statestore
from tests.dagster.conftest import BOTH_CATALOGS, latest_states, resources_for, store_name
from tests.dagster.test_dagster_definitions import FAST, check_results, metadata, run_checks
from tests.maintenance.streams import StoreStream

ROOT = Path(__file__).resolve().parents[2]


def test_nothing_that_writes_or_deletes_starts_on_its_own() -> None:
    repo = defs.get_repository_def()
    assert {s.name: s.default_status.value for s in repo.schedule_defs} == {
        "state_snapshots_every_15_minutes": "STOPPED",
        "state_validation_hourly": "STOPPED",
        "state_cleanup_daily": "STOPPED",
        "state_reconcile_weekly": "STOPPED",
    }
    # Discovery only adds Dagster partitions for the stores it finds, and the catalog events
    # and store failures sensors only read the catalog and report to Dagster: they observe.
    assert {s.name: s.default_status.value for s in repo.sensor_defs} == {
        "state_store_discovery": "RUNNING",
        "state_catalog_events": "RUNNING",
        "state_store_failures": "RUNNING",
        "state_snapshot_due": "STOPPED",
    }


def _statuses(autostart: str) -> subprocess.CompletedProcess[str]:
    """Load the code location in a fresh interpreter with STATE_DAGSTER_AUTOSTART set."""
    code = (
        "import json; from dagster_project.definitions import defs; r = defs.get_repository_def();"
        "print(json.dumps({s.name: s.default_status.value"
        " for s in [*r.schedule_defs, *r.sensor_defs]}))"
    )
    env = os.environ | {"STATE_DAGSTER_AUTOSTART": autostart}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_production_turns_them_on_by_name_or_all() -> None:
    chosen = _statuses("state_cleanup_daily, state_snapshot_due")
    assert chosen.returncode == 0, chosen.stderr
    running = {name for name, s in json.loads(chosen.stdout).items() if s == "RUNNING"}
    assert running == {
        "state_cleanup_daily",
        "state_snapshot_due",
        "state_store_discovery",
        "state_catalog_events",
        "state_store_failures",
    }
    everything = _statuses("all")
    assert set(json.loads(everything.stdout).values()) == {"RUNNING"}
    typo = _statuses("state_cleanup_dayly")
    assert typo.returncode != 0
    assert "STATE_DAGSTER_AUTOSTART names ['state_cleanup_dayly']" in typo.stderr


def _cli_health(stream: StoreStream) -> dict[str, dict[str, Any]]:
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    result = CliRunner(env={"STATE_CATALOG_URL": None}).invoke(
        statestore, ["--catalog-url", url, "-q", "health", "--json"], catch_exceptions=False
    )
    rows = {row["store"]: row for row in json.loads(result.output)}
    statuses = {row["status"] for row in rows.values()}
    expected = next(
        (
            code
            for status, code in (("broken", 2), ("degraded", 1), ("unknown", 3))
            if status in statuses
        ),
        0,
    )
    assert result.exit_code == expected, result.output  # the monitoring-plugin exit code
    return rows


@BOTH_CATALOGS
def test_a_corrupt_snapshot_is_broken_everywhere_blocks_cleanup_and_is_repaired(
    make_stream: Callable[..., StoreStream],
    instance: DagsterInstance,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = make_stream()
    stream.run(6)
    # the snapshot is damaged in place with its size kept: a full validation (the resource's
    # verify_sample_percent 100) finds it at once, the default sample only in time
    resources = resources_for(stream.catalog, replace(FAST, verify_sample_percent=100))
    materialize([state_snapshots], resources=resources, instance=instance)
    stream.run(2)
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    assert all(e.passed for e in check_results(run_checks(resources, instance)).values())

    store = stream.stores[0]
    [snapshot] = (stream.storage.root / store.directory).glob("*.snapshot")
    snapshot.write_bytes(snapshot.read_bytes()[:-7] + b"corrupt")
    relative = snapshot.relative_to(stream.storage.root).as_posix()
    name = store_name(stream, store)

    result = run_checks(resources, instance)
    evaluations = result.get_asset_check_evaluations()
    lineage = next(e for e in evaluations if e.check_name == "lineage_valid")
    assert not lineage.passed and lineage.metadata["failing_stores"].value == [name]
    per_store = {e.partition: e for e in evaluations if e.check_name == "store_status"}
    assert set(per_store) == {name}  # the others' result did not change: not evaluated again
    broken = per_store[name]
    assert not broken.passed and broken.severity.value == "ERROR"
    assert broken.metadata["store"].value == name
    assert broken.metadata["status"].value == "broken"

    # The validation job tells the same truth although its blocking check fails: the broken
    # store's partition records it broken (an observation), the others healthy, the fleet counts one
    # broken store, and the store_status check's latest evaluation is the broken store's.
    validation = defs.resolve_job_def("state_validation_job").execute_in_process(
        instance=instance, resources=resources, raise_on_error=False
    )
    assert not validation.success  # the blocking lineage_valid failed the step
    statuses = {p: m["status"] for p, m in latest_states(instance).items()}
    assert statuses == {
        store_name(stream, s): "broken" if s == store else "healthy" for s in stream.stores
    }
    [fleet] = [
        e for e in validation.get_asset_materialization_events() if e.asset_key == HEALTH_KEY
    ]
    fleet_figures = fleet.materialization.metadata
    assert fleet_figures["broken_stores"].value == 1 and fleet_figures["stores"].value == 3
    status_check = AssetCheckKey(state_checkpoints.key, "store_status")
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([status_check])
    evaluation = latest[status_check].event
    assert evaluation is not None and evaluation.asset_check_evaluation is not None
    assert evaluation.asset_check_evaluation.partition == name
    assert not evaluation.asset_check_evaluation.passed

    materialize([state_store_health], resources=resources, instance=instance)
    observed = latest_states(instance)[name]
    cli = _cli_health(stream)[str(stream.key(store))]
    assert observed["status"] == cli["status"] and observed["status_reason"] == cli["status_reason"]
    since = datetime.fromisoformat(cli["status_since"]).timestamp()
    assert observed["status_since"] == broken.metadata["status_since"].value == since
    assert broken.metadata["status_reason"].value == cli["status_reason"]
    assert cli["status"] == "broken" and relative in cli["status_reason"]
    fields = ("status", "status_reason", "status_since")
    if stream.catalog.dialect == "postgresql":
        with stream.catalog.engine.connect() as connection:
            row = connection.execute(
                sa.text(
                    "SELECT status, status_reason, status_since FROM state_store_health"
                    " WHERE checkpoint_root = :root AND operator_id = 0 AND partition_id = 0"
                ),
                {"root": stream.root},
            ).one()
        assert (row[0], row[1], row[2].isoformat()) == tuple(cli[f] for f in fields)

    # The cleanup job validates first; the failing lineage check blocks its deletion, and
    # its console tells it once, as the validation job does: the check and its first finding.
    cleanup = defs.resolve_job_def("state_cleanup_job")
    run_config = {"ops": {"state_retention_cleanup": {"config": {"dry_run": False}}}}
    capsys.readouterr()
    blocked = cleanup.execute_in_process(
        instance=instance, run_config=run_config, raise_on_error=False, resources=resources
    )
    assert not blocked.success
    console = capsys.readouterr().err
    assert "Traceback" not in console and "Stack Trace" not in console
    assert "DagsterAssetCheckFailedError" not in console
    [why] = [line for line in console.splitlines() if line.startswith("lineage_valid failed: ")]
    assert relative in why and "statestore" in why, why
    assert not blocked.asset_materializations_for_node("state_retention_cleanup")
    assert stream.catalog.deletion_history(root=stream.root) == []
    # The library holds the broken store even when cleanup runs without the check.
    alone = materialize(
        [state_retention_cleanup], resources=resources, instance=instance, run_config=run_config
    )
    cleaned = metadata(alone, "state_retention_cleanup")
    assert cleaned["held_stores"] == 1 and name in cleaned["held"]
    deleted = {d.path for d in stream.catalog.deletion_history(root=stream.root)}
    assert deleted and not {i.path for i in stream.committed[store]} & deleted

    repair_config = {"ops": {"state_snapshot_repair": {"config": {"dry_run": False}}}}
    dry = materialize([state_snapshot_repair], resources=resources, instance=instance)
    assert metadata(dry, "state_snapshot_repair")["damaged_snapshots"] == 1
    repaired = materialize(
        [state_snapshot_repair], resources=resources, instance=instance, run_config=repair_config
    )
    assert metadata(repaired, "state_snapshot_repair")["repaired"] == 1
    assert _cli_health(stream)[str(stream.key(store))]["status"] == "healthy"
    done = cleanup.execute_in_process(instance=instance, run_config=run_config, resources=resources)
    assert done.success
    assert metadata(done, "state_retention_cleanup")["deleted_files"] >= 6
    assert {i.path for i in stream.committed[store][:6]} <= {
        d.path for d in stream.catalog.deletion_history(root=stream.root)
    }
    for s in stream.stores:
        assert stream.loaded(s, 8) == stream.expected(s, 8)
    assert AssetCheckKey(state_checkpoints.key, "lineage_valid") in {
        spec.key for spec in state_checkpoint_checks.check_specs if spec.blocking
    }
