"""``statestore restore``: a query returns to an earlier, intact batch after a real loss (a
store's folder or a file deleted by hand), on real files and SQLite / PostgreSQL catalogs;
the stream then resumes and its state equals the model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from state_runtime.catalog import FileState
from state_runtime.cli import main
from state_runtime.errors import MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    cleanup_pass,
    plan_restore,
    run_checks,
)
from tests.maintenance.streams import StoreStream

LOST = StoreId(0, 1)


@pytest.fixture
def stream(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Three stores, batches 0-7 committed (versions 1-8)."""
    stream = make_stream()
    stream.run(8)
    return stream


def statestore(stream: StoreStream, *args: str) -> Result:
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    runner = CliRunner(env={"COLUMNS": "250", "STATE_CATALOG_URL": None})
    return runner.invoke(main, ["--catalog-url", url, "-q", *args], catch_exceptions=False)


def rewind_model(stream: StoreStream, batch: int, restarted: set[StoreId] = frozenset()) -> None:
    """What the stream's model looks like after a restore to ``batch``: kept stores at the
    batch's version, restarted ones empty; fresh providers, as a restarted query has."""
    for store in stream.stores:
        keep = 0 if store in restarted else batch + 1
        stream.committed[store] = stream.committed[store][:keep]
        stream.states[store] = stream.states[store][: keep + 1]
        stream.providers[store] = stream.provider(store)
    stream.batch = batch + 1


def assert_state_matches_model(stream: StoreStream) -> None:
    for store in stream.stores:
        latest = len(stream.committed[store])
        assert stream.loaded(store, latest) == stream.expected(store, latest), store
    committed = stream.catalog.latest_committed(stream.root)
    assert {s: r.version for s, r in committed.items()} == {
        s: len(stream.committed[s]) for s in stream.stores
    }


def test_restore_to_an_intact_batch_after_a_later_file_was_lost(stream: StoreStream) -> None:
    """The newest delta of one store is deleted by hand: restoring batch 7 is refused and
    names the file; batch 6 is intact, restored; the stream resumes and equals the model."""
    lost = stream.committed[LOST][-1]
    (stream.storage.root / lost.path).unlink()
    fleet = Fleet(stream.catalog, owner="tests")
    with pytest.raises(MaintenanceRefused) as refused:
        plan_restore(fleet, stream.root, stream.query, 7, spark_checkpoint="")
    message = str(refused.value)
    assert lost.path in message and "storage no longer has it" in message
    assert message.endswith(
        "Restore batch 6, the newest earlier batch whose stores are all intact (--to-batch 6), "
        "or accept the loss of these stores with --allow-lost-state (they start again from "
        "empty, with the other stores of their operator and partition, while the others "
        "return to batch 7)"
    )

    dry = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "6",
        "--no-spark-checkpoint",
    )
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output and "returns to batch 6" in dry.output
    assert stream.catalog.latest_committed(stream.root)[LOST].version == 8  # nothing changed

    done = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "6",
        "--no-spark-checkpoint",
        "--execute",
        "--json",
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["executed"] and report["run_id"] is not None
    assert sorted({e["batch_id"] for e in report["superseded"]}) == [7]
    assert len(report["superseded"]) == 3

    # The superseded versions' files are orphans whose reason names the restore.
    run_id = report["run_id"]
    files = stream.catalog.store_files(stream.root, LOST)
    later = [f for f in files if f.version == 8]
    assert later and all(f.state == FileState.ORPHAN.value for f in later)
    assert all(f"restored to batch 6 by run {run_id}" in (f.state_reason or "") for f in later)

    rewind_model(stream, 6)
    assert_state_matches_model(stream)
    stream.run(3)  # the query resumes at batch 7 and commits versions 8, 9, 10 again
    assert_state_matches_model(stream)
    assert run_checks(fleet, MaintenancePolicy.from_env(preset="demo")).ok

    # Cleanup deletes the superseded files like any orphan; the ledger says why.
    report_cleanup = cleanup_pass(fleet, MaintenancePolicy.from_env(preset="demo"), dry_run=False)
    assert not report_cleanup.failed
    reasons = {d.file.path: d.reason for d in report_cleanup.deleted}
    assert all(
        f"restored to batch 6 by run {run_id}" in reasons[f.path]
        for f in later
        if f.path in reasons
    )
    assert any(f.path in reasons for f in later)
    assert_state_matches_model(stream)


def test_a_lost_store_restarts_from_empty_only_when_the_user_accepts(
    stream: StoreStream,
) -> None:
    """One store's whole folder is deleted by hand: no batch is intact for it; the restore
    refuses, then with --allow-lost-state that store starts from empty, the others return
    to batch 5, and the stream resumes."""
    folder = stream.storage.root / "state" / "0" / "1" / "default"
    shutil.rmtree(folder)
    refused = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "5",
        "--no-spark-checkpoint",
    )
    assert refused.exit_code == 3, refused.output
    assert (
        "No earlier committed batch has all its stores intact: accept the loss of these "
        "stores with --allow-lost-state (they start again from empty, with the other stores "
        "of their operator and partition, while the others return to batch 5)"
    ) in " ".join(refused.output.split())
    assert "--allow-lost-state" in refused.output and "0/1/default" in refused.output

    done = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "5",
        "--no-spark-checkpoint",
        "--allow-lost-state",
        "--execute",
    )
    assert done.exit_code == 0, done.output
    assert "lost, starts again from empty" in done.output and "0/1/default" in done.output
    assert "resumes at batch 6" in done.output
    assert LOST not in stream.catalog.latest_committed(stream.root)

    rewind_model(stream, 5, restarted={LOST})
    stream.run(2)
    assert_state_matches_model(stream)
    fleet = Fleet(stream.catalog, owner="tests")
    assert run_checks(fleet, MaintenancePolicy.from_env(preset="demo")).ok


def test_restore_refuses_without_knowing_the_spark_checkpoint(
    stream: StoreStream, tmp_path: Path
) -> None:
    unsure = statestore(stream, "restore", stream.root, "--query", stream.query, "--to-batch", "3")
    assert unsure.exit_code == 3
    assert "--spark-checkpoint DIR" in unsure.output and "--no-spark-checkpoint" in unsure.output
    # A Spark checkpoint that never committed batch 3 cannot resume there.
    spark = tmp_path / "spark"
    for name in ("offsets", "commits"):
        (spark / name).mkdir(parents=True)
        for n in range(3):
            (spark / name / str(n)).write_text("v1\n")
    behind = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "3",
        "--spark-checkpoint",
        str(spark),
    )
    assert behind.exit_code == 3
    assert "has no committed batch 3" in behind.output and "commits: 0-2" in behind.output
    unknown = statestore(
        stream,
        "restore",
        stream.root,
        "--query",
        stream.query,
        "--to-batch",
        "42",
        "--no-spark-checkpoint",
    )
    assert unknown.exit_code == 2 and "committed batches: 0-7" in unknown.output
