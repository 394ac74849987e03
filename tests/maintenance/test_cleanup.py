"""The cleanup pass: dry run, safety floor, execution, ledger, resume, overlap, live stream."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from state_runtime.catalog import FileState, RetentionPolicy, Verdict
from state_runtime.errors import MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    cleanup_pass,
    snapshot_pass,
)
from state_runtime.maintenance.cleanup import SAMPLE
from tests.gates import Gates
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=5)
LATER = datetime.now(UTC) + timedelta(days=1)  # every file is past the window


def snapshotted(stream: StoreStream, batches: int = 8) -> StoreStream:
    """``batches`` batches with a snapshot after the fifth, plus one abandoned attempt."""
    stream.run(5)
    snapshot_pass(fleet_on(stream), POLICY)
    stream.abandoned_attempt(stream.stores[0])
    stream.run(batches - 5)
    return stream


def on_disk(stream: StoreStream) -> set[str]:
    root = stream.storage.root
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def assert_retained_versions_load(stream: StoreStream, retain: int = 2) -> None:
    for store in stream.stores:
        latest = len(stream.committed[store])
        for version in range(latest, latest - retain, -1):
            assert stream.loaded(store, version) == stream.expected(store, version)


def test_dry_run_is_the_default_and_deletes_nothing(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream())
    before = on_disk(stream)
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    assert report.dry_run and report.run_id is None and not report.deleted
    assert on_disk(stream) == before
    planned = {v.file.path: v for v in report.planned}
    # deltas 1..4 are superseded by the snapshot at 5; so is delta 5 itself (versions 8 and 7
    # load from the snapshot); the abandoned attempt is an orphan
    superseded = {info.path for s in stream.stores for info in stream.committed[s][:5]}
    assert {
        p for p, v in planned.items() if v.verdict is Verdict.DELETABLE_SUPERSEDED
    } == superseded
    [orphan] = [v for v in planned.values() if v.verdict is Verdict.DELETABLE_ORPHAN]
    assert orphan.file.key.store == stream.stores[0]
    assert all(v.reason for v in planned.values())


def test_execute_deletes_the_plan_records_the_ledger_and_lists_nothing(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream())
    plan = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    before = on_disk(stream)
    stream.storage.requests.reset()
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False)
    assert stream.storage.requests.counts.get("list", 0) == 0
    assert {v.file.path for v in report.deleted} == {v.file.path for v in plan.planned}
    assert not report.failed and not report.busy
    assert on_disk(stream) == before - {v.file.path for v in plan.planned}
    ledger = {d.path: d for d in stream.catalog.deletion_history(root=stream.root)}
    assert set(ledger) == {v.file.path for v in plan.planned}
    assert all(d.run_id == report.run_id and d.reason for d in ledger.values())
    assert_retained_versions_load(stream)
    again = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False)
    assert not again.planned and not again.deleted


def test_files_younger_than_the_window_stay(make_stream: Callable[..., StoreStream]) -> None:
    stream = snapshotted(make_stream())
    report = cleanup_pass(fleet_on(stream), POLICY, dry_run=False)  # now: all files are young
    assert report.planned == [] and report.deleted == []


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            MaintenancePolicy(retention=RetentionPolicy(window=timedelta(minutes=1))),
            "shorter than the configured minimum of 10m",
        ),
        (
            MaintenancePolicy(
                retention=RetentionPolicy(window=timedelta(minutes=5)),
                min_window=timedelta(minutes=30),
            ),
            "retention window 5m is shorter than the configured minimum of 30m",
        ),
    ],
)
def test_unsafe_retention_is_refused_before_anything_happens(
    make_stream: Callable[..., StoreStream], policy: MaintenancePolicy, message: str
) -> None:
    stream = snapshotted(make_stream())
    before = on_disk(stream)
    with pytest.raises(MaintenanceRefused, match=message):
        cleanup_pass(fleet_on(stream), policy, now=LATER, dry_run=False)
    assert on_disk(stream) == before
    assert all(run.kind != "cleanup" for run in stream.catalog.recent_runs())


def test_fewer_than_two_versions_is_refused() -> None:
    with pytest.raises(MaintenanceRefused, match="below the safety floor of 2"):
        MaintenancePolicy(retention=RetentionPolicy(retain_versions=1))


def test_a_run_that_crashed_after_claiming_is_resumed(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream())
    catalog = stream.catalog
    crashed = catalog.start_run("cleanup", "crashed-run")
    claimed = catalog.claim_deletions(crashed, POLICY.retention, stream.root, now=LATER)
    half = [v.file.path for v in claimed[: len(claimed) // 2]]
    stream.storage.delete(half)  # deleted from storage, never recorded: then the crash
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False)
    assert {v.file.path for v in report.deleted} == {v.file.path for v in claimed}
    assert not report.failed
    assert not on_disk(stream) & {v.file.path for v in claimed}
    ledger = catalog.deletion_history(root=stream.root)
    assert sorted(d.path for d in ledger) == sorted(v.file.path for v in claimed)
    assert {d.run_id for d in ledger} == {report.run_id}
    assert_retained_versions_load(stream)


def test_two_overlapping_cleanups_delete_each_file_once(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream(stores=None))
    plan = {v.file.path for v in cleanup_pass(fleet_on(stream), POLICY, now=LATER).planned}
    reports = []
    barrier = threading.Barrier(2)

    def run(owner: str) -> None:
        barrier.wait()
        reports.append(cleanup_pass(fleet_on(stream, owner), POLICY, now=LATER, dry_run=False))

    threads = [threading.Thread(target=run, args=(f"run-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reports) == 2 and not any(r.failed for r in reports)
    ledger = stream.catalog.deletion_history(root=stream.root)
    assert sorted(d.path for d in ledger) == sorted(plan)
    assert not on_disk(stream) & plan
    assert_retained_versions_load(stream)


def test_maintenance_beside_a_running_stream_never_breaks_a_load(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A stream commits batch after batch (sometimes reloading from files, as a task on a new
    worker does) while snapshots and an aggressive cleanup (window 0) run in a loop."""
    stream = make_stream()
    aggressive = MaintenancePolicy(
        snapshot_min_deltas=3,
        retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(hours=1)),
        min_window=timedelta(0),
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    gates = Gates("maintenance")

    def maintain() -> None:
        fleet = Fleet(stream.catalog, owner="maintenance")
        while not stop.is_set():
            try:
                snapshot_pass(fleet, aggressive)
                cleanup_pass(fleet, aggressive, dry_run=False)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                return
            gates.made("maintenance")

    worker = threading.Thread(target=maintain)
    worker.start()
    try:
        for batch in range(30):
            if not gates.passed(stop):  # a maintenance round between batches, whatever the load
                break
            if batch % 3 == 0:
                for provider in stream.providers.values():
                    provider.drop_cache()  # the next batch loads from files
            stream.commit()
            for store in stream.stores:
                version = len(stream.committed[store])
                assert stream.loaded(store, version) == stream.expected(store, version)
    finally:
        stop.set()
        worker.join()
    assert not errors
    deleted = stream.catalog.deletion_history(root=stream.root)
    assert deleted, "cleanup ran beside the stream"
    assert_retained_versions_load(stream)
    live = {
        v.file.path
        for v in stream.catalog.file_verdicts(aggressive.retention, root=stream.root)
        if v.file.state != FileState.DELETED
    }
    assert live <= on_disk(stream)


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)  # the chunking is the point
def test_a_large_plan_is_deleted_and_recorded_in_batches(
    make_stream: Callable[..., StoreStream],
) -> None:
    """More files than one catalog IN-list chunk (400) in one delete batch."""
    stream = make_stream(stores=[StoreId(0, p) for p in range(60)], keys_per_store=5)
    stream.run(12)
    snapshot_pass(fleet_on(stream), MaintenancePolicy(snapshot_min_deltas=10))
    stream.run(2)
    plan = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    assert plan.planned_files > 600 and len(plan.planned) == SAMPLE  # counted; the first kept
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False)
    assert report.deleted_files == plan.planned_files and not report.failed
    assert len(report.deleted) == SAMPLE and len(report.rows()) == 60
    ledger = stream.catalog.deletion_history(root=stream.root, limit=10_000)
    assert len(ledger) == plan.planned_files
    assert_retained_versions_load(stream)


def test_a_worker_cache_behind_cleanup_still_loads(make_stream: Callable[..., StoreStream]) -> None:
    """A Python worker's cached copy of a store is often a few versions behind (DESIGN.md);
    after cleanup deleted the deltas between that copy and a newer snapshot, loading the
    latest version must still succeed, from the snapshot."""
    stream = make_stream()
    store = stream.stores[0]
    stream.run(3)
    stale = stream.provider(store)
    stale.get_read_store(3, stream.committed[store][2].checkpoint_id)  # cached at version 3
    stream.run(9)
    aggressive = MaintenancePolicy(
        snapshot_min_deltas=5,
        retention=RetentionPolicy(window=timedelta(0)),
        min_window=timedelta(0),
    )
    snapshot_pass(fleet_on(stream), aggressive)
    stream.run(1)
    assert cleanup_pass(fleet_on(stream), aggressive, dry_run=False).deleted
    latest = stream.committed[store][-1]
    loaded = stale.get_read_store(latest.version, latest.checkpoint_id)
    assert {k[0]: v[0] for k, v in loaded.items()} == stream.expected(store, latest.version)


def test_a_catalog_of_several_roots_is_cleaned_in_one_pass(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Unnarrowed, the plan's pages span roots: each root's files are claimed and deleted
    (a chunk claimed under another page's root claimed nothing, and the files stayed)."""
    first = snapshotted(make_stream("first"))
    second = snapshotted(make_stream("second"))
    fleet = Fleet(first.catalog, owner="tests")
    plan = cleanup_pass(fleet, POLICY, now=LATER)
    assert {v.file.key.root for v in plan.planned} == {first.root, second.root}
    report = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    assert report.deleted_files == plan.planned_files and not report.failed
    assert not cleanup_pass(fleet, POLICY, now=LATER).planned_files
