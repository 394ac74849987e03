"""The snapshot pass against real store files and a real catalog (SQLite and PostgreSQL)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from state_runtime.catalog import Catalog, StoreKey, StoreRecord
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    SnapshotReport,
    SnapshotStatus,
    due_for_snapshot,
    snapshot_pass,
    snapshots,
    store_reports,
)
from state_runtime.maintenance.snapshots import DueStore, SnapshotOutcome, _chunks
from tests.maintenance.streams import StoreStream

POLICY = MaintenancePolicy(snapshot_min_deltas=5)


def fleet_on(stream: StoreStream, owner: str = "tests") -> Fleet:
    """A fleet whose storage is the stream's, so its request counter sees maintenance."""
    return Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner=owner)


def test_snapshots_only_due_stores_and_lists_nothing(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(6)
    young = make_stream("other")  # 3 deltas: not due
    young.run(3)
    stream.storage.requests.reset()
    report = snapshot_pass(fleet_on(stream), POLICY)
    assert report.count(SnapshotStatus.WRITTEN) == len(stream.stores)
    assert {o.key.root for o in report.outcomes} == {stream.root}
    assert stream.storage.requests.counts.get("list", 0) == 0
    for store in stream.stores:
        path = stream.storage.root / store.directory
        assert any(p.name.startswith("6_") and p.suffix == ".snapshot" for p in path.iterdir())
    health = {r.key: r.health for r in store_reports(fleet_on(stream), POLICY)}
    assert all(health[stream.key(s)].deltas_since_snapshot == 0 for s in stream.stores)
    assert all(health[young.key(s)].deltas_since_snapshot == 3 for s in young.stores)
    stream.run(2)
    for store in stream.stores:  # a fresh process loads through the snapshot
        for version in (8, 7, 6):
            assert stream.loaded(store, version) == stream.expected(store, version)
    again = snapshot_pass(fleet_on(stream), POLICY)
    assert again.outcomes == []


def test_a_snapshot_written_before_a_crash_is_recorded_with_its_size(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=None)
    stream.run(5)
    store = stream.stores[0]
    info = stream.committed[store][-1]
    orphaned = stream.provider(store).snapshot(info.version, info.checkpoint_id)  # not recorded
    report = snapshot_pass(fleet_on(stream), POLICY)
    outcome = next(o for o in report.outcomes if o.key == stream.key(store))
    assert outcome.status is SnapshotStatus.RECORDED
    assert outcome.bytes == (stream.storage.root / orphaned.path).stat().st_size
    retained = stream.catalog.retained_versions(stream.root, store)
    assert retained[0].files[0].path == orphaned.path
    assert retained[0].files[0].size_bytes == outcome.bytes


def test_a_leased_store_is_skipped_until_its_lease_is_free(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(5)
    busy = stream.key(stream.stores[0])
    lease = stream.catalog.try_acquire_lease(busy, "someone-else", timedelta(minutes=5))
    assert lease is not None
    report = snapshot_pass(fleet_on(stream), POLICY)
    statuses = {o.key: o.status for o in report.outcomes}
    assert statuses.pop(busy) is SnapshotStatus.BUSY
    assert set(statuses.values()) == {SnapshotStatus.WRITTEN}
    stream.catalog.release_lease(lease)
    later = snapshot_pass(fleet_on(stream), POLICY)
    assert [(o.key, o.status) for o in later.outcomes] == [(busy, SnapshotStatus.WRITTEN)]


def test_recovery_cost_makes_a_short_chain_due(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(3)
    assert snapshot_pass(fleet_on(stream), POLICY).outcomes == []
    chains = [sum(i.bytes_written for i in infos) for infos in stream.committed.values()]
    costly = MaintenancePolicy(snapshot_min_deltas=50, snapshot_max_recovery_bytes=min(chains) - 1)
    report = snapshot_pass(fleet_on(stream), costly)
    assert report.count(SnapshotStatus.WRITTEN) == len(stream.stores)
    assert {o.deltas_since_snapshot for o in report.outcomes} == {3}
    cheap = MaintenancePolicy(snapshot_min_deltas=50, snapshot_max_recovery_bytes=10**9)
    stream.run(2)
    assert snapshot_pass(fleet_on(stream), cheap).outcomes == []


def test_an_unloadable_store_fails_alone_naming_the_file(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(6)
    broken = stream.stores[1]
    middle = stream.committed[broken][2]
    (stream.storage.root / middle.path).unlink()
    report = snapshot_pass(fleet_on(stream), POLICY)
    [failed] = report.failed
    assert failed.key == stream.key(broken)
    assert failed.path == middle.path and failed.error and middle.path in failed.error
    assert report.count(SnapshotStatus.WRITTEN) == len(stream.stores) - 1
    run = stream.catalog.run(report.run_id)
    assert run is not None and run.outcome == "succeeded" and run.counts["failed"] == 1


def _snapshot_in_process(url: str, root: str, owner: str) -> dict[str, str]:
    catalog = Catalog.open(url)
    try:
        fleet = Fleet(catalog, roots=[root], owner=owner)
        report = snapshot_pass(fleet, POLICY)
        return {str(o.key): o.status.value for o in report.outcomes}
    finally:
        catalog.close()


def test_overlapping_runs_in_two_processes_snapshot_each_store_once(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[StoreId(0, i) for i in range(12)])
    stream.run(5)
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    # spawn, not fork: a worker of this test session may already hold a JVM gateway and the
    # catalog's threads, and a child forked from it can die mid-task (a pool then waits forever)
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.starmap(
            _snapshot_in_process, [(url, stream.root, "run-a"), (url, stream.root, "run-b")]
        )
    written = [key for result in results for key, s in result.items() if s == "written"]
    assert sorted(written) == sorted(str(stream.key(s)) for s in stream.stores)
    for store in stream.stores:
        snapshots = list((stream.storage.root / store.directory).glob("*.snapshot"))
        assert len(snapshots) == 1
        assert stream.loaded(store, 5) == stream.expected(store, 5)


def test_snapshots_go_costliest_cold_load_first_and_at_most_per_run(
    make_stream: Callable[..., StoreStream],
) -> None:
    """At fleet size a pass cannot snapshot everything due: it writes ``snapshots_per_run``,
    the stores whose cold load reads the most first; the rest stay due for the next run."""
    long = make_stream("long")
    long.run(9)
    short = make_stream("short")
    short.run(6)
    fleet = Fleet(long.catalog, owner="tests")
    limited = MaintenancePolicy(snapshot_min_deltas=5, snapshots_per_run=2)
    due = due_for_snapshot(fleet, POLICY)
    assert len(due) == 6
    assert [d.recovery_bytes for d in due] == sorted((d.recovery_bytes for d in due), reverse=True)
    assert {d.record.key.root for d in due[:3]} == {long.root}
    assert due_for_snapshot(fleet, limited) == due[:2]
    report = snapshot_pass(fleet, limited)
    assert [o.key for o in report.outcomes] == [d.record.key for d in due[:2]]
    assert report.count(SnapshotStatus.WRITTEN) == 2
    assert [d.record.key for d in due_for_snapshot(fleet, POLICY)] == [
        d.record.key for d in due[2:]
    ]
    assert long.catalog.runs_after(0)[-1].parameters["snapshots_per_run"] == 2


def test_the_pass_hands_stores_out_by_priority_whatever_their_roots(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers take the due stores a window at a time in priority order (a chunk is one
    root's stores of a window): with windows of one store, the pass snapshots them exactly in
    priority order, across roots whose costs interleave."""
    monkeypatch.setattr(snapshots, "CHUNK_STORES", 1)
    streams = [make_stream(f"root-{n}") for n in range(3)]
    for n, stream in enumerate(streams):
        stream.run(5 + n)  # each root's chains a different length: the priority interleaves
    fleet = Fleet(streams[0].catalog, owner="tests")
    due = due_for_snapshot(fleet, POLICY)
    assert len({d.record.key.root for d in due}) == 3
    report = snapshot_pass(fleet, POLICY, workers=1)
    assert [o.key for o in report.outcomes] == [d.record.key for d in due]
    assert report.count(SnapshotStatus.WRITTEN) == len(due) == 9


def test_a_chunk_is_one_roots_stores_of_a_window() -> None:
    """Chunks follow the priority a window (a chunk a worker) at a time; within a window
    they group each root's stores, at most CHUNK_STORES, spread over the workers."""
    due = [
        DueStore(record, 10, cost)
        for cost, record in zip(range(100, 0, -1), _records(100, roots=3), strict=True)
    ]
    chunks = list(_chunks(due, workers=2))
    window = 2 * snapshots.CHUNK_STORES
    assert [d for c in chunks for d in c] != due  # regrouped within windows
    seen = 0
    for chunk in chunks:
        assert len({d.record.key.root for d in chunk}) == 1
        assert len(chunk) <= snapshots.CHUNK_STORES
        start = seen // window * window  # the window this chunk came from
        assert all(d in due[start : start + window] for d in chunk)
        seen += len(chunk)
    assert sorted(id(d) for c in chunks for d in c) == sorted(id(d) for d in due)


def _records(count: int, roots: int) -> list[StoreRecord]:
    """``count`` store records over ``roots`` roots, in turn."""
    return [
        StoreRecord(
            StoreKey(f"file:///data/root-{n % roots}", StoreId(0, n)),
            "k bigint",
            "v bigint",
            datetime(2026, 1, 1, tzinfo=UTC),
            CheckpointRef(12, "0" * 32),
            None,
        )
        for n in range(count)
    ]


def test_a_report_keeps_its_first_outcomes_and_failures_and_counts_all() -> None:
    """A pass over a fleet of any size holds at most OUTCOMES_KEPT outcomes and as many
    failures (a failure past the first outcomes is still shown), and counts every one."""
    report = SnapshotReport(run_id=1)
    kept = snapshots.OUTCOMES_KEPT
    for n, record in enumerate(_records(3 * kept, roots=1)):
        status = SnapshotStatus.FAILED if n % 2 else SnapshotStatus.WRITTEN
        report.add(SnapshotOutcome(record.key, status, 12, 10, bytes=100, error="e" * (n % 2)))
    assert (
        report.count(SnapshotStatus.WRITTEN)
        == report.count(SnapshotStatus.FAILED)
        == (3 * kept // 2)
    )
    assert report.bytes_written == 100 * 3 * kept // 2
    assert len(report.outcomes) == len(report.failed) == kept
    rows = report.rows()
    assert len(rows) == kept + kept // 2  # the first outcomes, then the failures past them
    assert [r["store"] for r in rows if r["status"] == "failed"] == [
        str(o.key) for o in report.failed
    ]
    assert "1500 failed" in report.summary()
