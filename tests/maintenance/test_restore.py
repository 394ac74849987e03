"""``statestore restore``: a query returns to an earlier, intact batch after a real loss (a
store's folder or a file deleted by hand), on real files and SQLite / PostgreSQL catalogs;
the stream then resumes and its state equals the model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from state_runtime.catalog import Catalog, FileState
from state_runtime.cli import main
from state_runtime.errors import MaintenanceRefused, StorageError, StorageUnavailable
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    StoreStatus,
    cleanup_pass,
    plan_restore,
    restore_query,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage
from state_runtime.storage.base import ByteStream
from state_runtime.store.file_verification import MISSING
from tests.maintenance.conftest import STORES
from tests.maintenance.streams import StoreStream
from tests.s3_faults import FaultProxy
from tests.s3_fixtures import MotoS3

LOST = StoreId(0, 1)
# snapshots after two deltas; nothing retained beyond the latest version, no grace
ZERO = MaintenancePolicy(
    snapshot_min_deltas=2,
    retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0)),
    min_window=timedelta(0),
)


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
    assert "." not in message.removesuffix(")").split("storage no longer has it")[1]
    assert message.endswith(
        "storage no longer has it; batch 6 is the newest batch whose stores all load: restore "
        "it (--to-batch 6), or accept the loss of these stores with --allow-lost-state (they "
        "start again from empty, with the other stores of their operator and partition, while "
        "the others return to batch 7)"
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


def test_a_plan_reads_each_stores_records_once(
    stream: StoreStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused plan weighs batch after batch for the newest intact one: each store's idle
    versions are read once per plan, as its file records are, not once per batch weighed."""
    (stream.storage.root / stream.committed[LOST][-3].path).unlink()  # batch 5's delta
    read: list[StoreId] = []
    idle_versions = type(stream.catalog).idle_versions

    def counted(catalog: Catalog, root: str, store: StoreId) -> frozenset[int]:
        read.append(store)
        return idle_versions(catalog, root, store)

    monkeypatch.setattr(type(stream.catalog), "idle_versions", counted)
    with pytest.raises(MaintenanceRefused, match="batch 4 is the newest batch"):
        plan_restore(
            Fleet(stream.catalog, owner="tests"), stream.root, stream.query, 7, spark_checkpoint=""
        )
    assert sorted(read) == sorted(set(read)) and set(read) <= set(stream.stores), read


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
        "; no committed batch of query query-1 has all its stores intact: accept the loss of "
        "these stores with --allow-lost-state (they start again from empty, with the other stores "
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
    said = " ".join(unsure.output.split())
    assert "--spark-checkpoint DIR with DIR its checkpointLocation" in said
    assert "--no-spark-checkpoint" in said
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


def test_a_restore_next_to_versions_cleanup_deleted_leaves_them_expired(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Versions 1-6, a snapshot of 6, versions 7-8, cleanup at zero windows: the deltas 1-6
    go, and versions 1-5 expire with them. A restore to batch 5 (version 6, from its
    snapshot) then retains version 6 alone: the expired version 5 is not retained again, so
    validation and health call nothing broken, and the stream resumes on it. (Found by the
    simulation: version 5 was retained again and could not load.)"""
    stream = make_stream()
    fleet = Fleet(stream.catalog, owner="tests")
    stream.run(6)
    snapshot_pass(fleet, ZERO)
    stream.run(2)
    deleted = cleanup_pass(fleet, ZERO, dry_run=False).deleted
    assert {d.file.version for d in deleted} == {1, 2, 3, 4, 5, 6}
    assert {s.expired_through for s in stream.catalog.stores(stream.root)} == {5}

    plan = plan_restore(fleet, stream.root, stream.query, 5, spark_checkpoint="")
    assert {s: b.version for s, b in plan.bases.items()} == {s: 5 for s in stream.stores}
    assert "gets its own snapshot if its files still load it" in plan.rows()[0]["detail"]
    restore_query(fleet, plan, ZERO)
    # version 5 changed state and its delta is gone: a loss, named as one (a rerun cannot help)
    assert plan.gone_bases == sorted(stream.stores) and plan.stayed_expired == []
    summary = plan.summary()
    assert "is gone (no file loads it" in summary and "stayed expired" not in summary, summary
    assert all("version 5 is gone" in row["detail"] for row in plan.rows()), plan.rows()
    assert plan.counts()["bases_gone"] == len(stream.stores)
    for store in stream.stores:
        retained = stream.catalog.retained_versions(stream.root, store)
        assert [v.ref.version for v in retained] == [6] and retained[0].complete, store
    checks = run_checks(fleet, ZERO)
    assert checks.ok, [str(e) for o in checks.outcomes if not o.passed for e in o.findings]
    reports = store_reports(fleet, ZERO)
    assert not [r for r in reports if r.status.status is StoreStatus.BROKEN]

    rewind_model(stream, 5)
    stream.run(2)  # versions 7 and 8 again
    assert_state_matches_model(stream)
    assert run_checks(fleet, ZERO).ok
    assert {s.expired_through for s in stream.catalog.stores(stream.root)} == {5}


def test_a_delta_intact_again_after_a_failed_validation_is_restored(stream: StoreStream) -> None:
    """A delta corrupted by hand fails validation; put back intact (from a backup), the
    restore reads it and accepts its batch: the catalog's old verdict does not refuse it
    (found by the simulation). While it is corrupt, the restore names it."""
    delta = stream.storage.root / stream.committed[LOST][5].path  # version 6: batch 5
    intact_bytes = delta.read_bytes()
    damaged = bytearray(intact_bytes)
    damaged[len(damaged) // 2] ^= 0xFF
    delta.write_bytes(bytes(damaged))
    fleet = Fleet(stream.catalog, owner="tests")
    assert not run_checks(fleet, MaintenancePolicy.from_env(preset="demo")).ok
    with pytest.raises(MaintenanceRefused, match="storage has: "):
        plan_restore(fleet, stream.root, stream.query, 6, spark_checkpoint="")

    delta.write_bytes(intact_bytes)
    plan = plan_restore(fleet, stream.root, stream.query, 6, spark_checkpoint="")
    assert not plan.restarted
    restore_query(fleet, plan, MaintenancePolicy.from_env(preset="demo"))
    rewind_model(stream, 6)
    assert_state_matches_model(stream)


class ReadLog(LocalStorage):
    """A local root that notes every path read."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.read_paths: list[str] = []

    def read(self, path: str) -> bytes:
        self.read_paths.append(path)
        return super().read(path)


def test_a_plan_reads_only_the_failed_snapshots_that_could_be_its_base(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Snapshots at versions 3 and 6, the one at 3 corrupted by hand and failed by validation:
    planning batch 6 (version 7, based on the verified 6) does not read it; planning batch 3
    (version 4) reads it, and not the snapshot at 6, above the version."""
    stream = make_stream()
    policy = MaintenancePolicy(snapshot_min_deltas=3)
    for _ in range(2):
        stream.run(3)
        assert snapshot_pass(Fleet(stream.catalog, owner="tests"), policy).outcomes
    stream.run(2)
    snaps = {
        f.version: f.path
        for f in stream.catalog.store_files(stream.root, LOST)
        if f.path.endswith(".snapshot")
    }
    assert sorted(snaps) == [3, 6]
    damaged = stream.storage.root / snaps[3]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    checks = MaintenancePolicy(
        retention=RetentionPolicy(retain_versions=8),
        verify_sample_percent=100,
        min_window=timedelta(0),
    )
    assert not run_checks(Fleet(stream.catalog, owner="tests"), checks).ok

    log = ReadLog(stream.storage.root)
    fleet = Fleet(stream.catalog, open_storage=lambda root: log, owner="tests")
    plan_restore(fleet, stream.root, stream.query, 6, spark_checkpoint="")
    assert snaps[3] not in log.read_paths
    log.read_paths.clear()
    plan_restore(fleet, stream.root, stream.query, 3, spark_checkpoint="")
    assert snaps[3] in log.read_paths and snaps[6] not in log.read_paths


def test_a_restore_records_the_missing_snapshot_it_passed_over(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Versions 1-6, a snapshot of 6, versions 7-8; the snapshot of one store is deleted by
    hand. A restore to batch 5 loads that store's version 6 from deltas 1-6, passing over the
    snapshot; executed (not in its dry run), it records the snapshot as failed, so cleanup at
    zero windows keeps the deltas below it (it deleted them: the catalog judged the snapshot
    their base), and health reports the missing file. The stream resumes on them."""
    stream = make_stream()
    fleet = Fleet(stream.catalog, owner="tests")
    stream.run(6)
    snapshot_pass(fleet, ZERO)
    stream.run(2)
    (snapshot,) = [
        f for f in stream.catalog.store_files(stream.root, LOST) if f.path.endswith(".snapshot")
    ]
    assert snapshot.version == 6 and snapshot.verification == "verified"
    (stream.storage.root / snapshot.path).unlink()

    plan = plan_restore(fleet, stream.root, stream.query, 5, spark_checkpoint="")
    assert not plan.restarted and plan.damaged == {snapshot.path: MISSING}
    assert _verification(stream, snapshot.path) == ("verified", None)  # a dry run records none
    restore_query(fleet, plan, ZERO)
    assert _verification(stream, snapshot.path) == ("failed", MISSING)

    below = {f.path for f in stream.committed[LOST][:6]}  # deltas 1-6
    deleted = {d.file.path for d in cleanup_pass(fleet, ZERO, dry_run=False).deleted}
    assert deleted and not deleted & below
    assert all((stream.storage.root / path).exists() for path in below)
    reports = {r.key.store: r.status.status for r in store_reports(fleet, ZERO)}
    assert reports[LOST] is not StoreStatus.HEALTHY, reports

    rewind_model(stream, 5)
    assert_state_matches_model(stream)
    stream.run(2)
    assert_state_matches_model(stream)


def _verification(stream: StoreStream, path: str) -> tuple[str, str | None]:
    (found,) = [f for f in stream.catalog.store_files(stream.root, LOST) if f.path == path]
    return found.verification, found.verification_note


class FullDisk(LocalStorage):
    """Local storage that refuses every write while ``full``, as a disk out of space does
    (a failure a retry does not cure)."""

    full = False

    def write_if_absent(self, path: str, data: bytes) -> None:
        self._check(path)
        super().write_if_absent(path, data)

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        self._check(path)
        super().write_stream_if_absent(path, source, size)

    def _check(self, path: str) -> None:
        if self.full:
            raise StorageError("cannot write: No space left on device", path=path)


def with_expired_bases(stream: StoreStream) -> Fleet:
    """Batch 2 idle (version 3 has version 2's id), a snapshot of version 3, batch 3, cleanup
    at zero windows: versions 1-2 expire, so a restore to batch 2 has an expired base (version
    2) in every store. The fleet opens the stream's own storage."""
    fleet = Fleet(stream.catalog, owner="tests", open_storage=lambda _root: stream.storage)
    stream.run(3)
    snapshot_pass(fleet, ZERO)
    stream.run(1)
    cleanup_pass(fleet, ZERO, dry_run=False)
    assert {s.expired_through for s in stream.catalog.stores(stream.root)} == {2}
    return fleet


def test_an_executed_restore_names_the_bases_it_could_not_write(
    catalog: Catalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The base's own snapshot cannot be written (a full disk): the restore completes, its
    bases stay expired, and its summary and rows say so after execution (a replay of the
    batch fails with StateLost) instead of claiming each base got its snapshot."""
    storage = FullDisk(tmp_path / "checkpoint")
    stream = StoreStream(catalog, storage, STORES, idle=frozenset({2}))
    fleet = with_expired_bases(stream)
    plan = plan_restore(fleet, stream.root, stream.query, 2, spark_checkpoint="")
    assert {s: b.version for s, b in plan.bases.items()} == {s: 2 for s in STORES}
    assert "gets its own snapshot" in plan.rows()[0]["detail"]
    assert "stayed expired" not in plan.summary()

    storage.full = True
    restore_query(fleet, plan, ZERO)
    assert plan.executed and plan.reopened == [] and plan.stayed_expired == sorted(STORES)
    summary = plan.summary()
    assert "stayed expired" in summary and "StateLost" in summary, summary
    assert all(f"{stream.root}#{store}" in summary for store in STORES), summary
    for row in plan.rows():
        assert "stayed expired" in row["detail"] and "own snapshot" not in row["detail"], row
    assert plan.counts()["bases_reopened"] == 0
    assert caplog.text.count("No space left on device") == len(STORES)
    assert {s.expired_through for s in stream.catalog.stores(stream.root)} == {2}


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_a_storage_outage_aborts_the_restore_before_its_switch(
    moto_s3: MotoS3, fault_proxy: FaultProxy, catalog: Catalog
) -> None:
    """S3 answers 503 to every write while the restore writes the bases (a real outage,
    through the fault proxy): StorageUnavailable aborts the restore before its catalog switch
    (it would otherwise "succeed" with a replay that fails), the query stays at its last
    batch, and the same restore run again after the outage completes and reopens them."""
    storage = moto_s3.storage(endpoint_url=fault_proxy.url, max_attempts=2)
    stream = StoreStream(catalog, storage, STORES, idle=frozenset({2}))
    fleet = with_expired_bases(stream)
    plan = plan_restore(fleet, stream.root, stream.query, 2, spark_checkpoint="")
    for operation in ("PutObject", "CreateMultipartUpload", "UploadPart"):
        fault_proxy.error(operation, status=503, code="ServiceUnavailable", times=-1)
    with pytest.raises(StorageUnavailable):
        restore_query(fleet, plan, ZERO)
    committed = catalog.latest_committed(stream.root)
    assert {r.version for r in committed.values()} == {4}  # no switch: still at batch 3
    assert {s.expired_through for s in catalog.stores(stream.root)} == {2}

    fault_proxy.reset()
    plan = plan_restore(fleet, stream.root, stream.query, 2, spark_checkpoint="")
    restore_query(fleet, plan, ZERO)
    assert plan.reopened == sorted(STORES) and plan.stayed_expired == []
    assert "stayed expired" not in plan.summary()
    assert "got its own snapshot" in plan.rows()[0]["detail"]
    assert {r.version for r in catalog.latest_committed(stream.root).values()} == {3}
    for store in STORES:
        assert stream.loaded(store, 2) == stream.expected(store, 2), store
