"""The snapshot pass against real store files and a real catalog (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, Lease, RetainedVersion, StoreKey, StoreRecord
from state_runtime.cli.jsonable import jsonable
from state_runtime.errors import CommitConflict
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
from state_runtime.storage import LocalStorage
from state_runtime.storage.base import ByteStream
from tests.maintenance.lease_clock import LeaseClock
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore

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
    run = long.catalog.run(report.run_id)
    assert run is not None and run.parameters["snapshots_per_run"] == 2


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
    assert report.counts()["bytes_written"] == 100 * 3 * kept // 2
    assert len(report.failed) == kept
    assert len(report.outcomes) == kept + kept // 2  # the first, then the failures past them
    rows = report.rows()
    assert [r["store"] for r in rows] == [str(o.key) for o in report.outcomes]
    assert [r["store"] for r in rows if r["status"] == "failed"] == [
        str(o.key) for o in report.failed
    ]
    assert "1500 failed" in report.summary()
    printed = jsonable(report)  # what --json prints: each outcome once, the counts once
    assert set(printed) == {"run_id", "outcomes", "counts"}
    assert len({o["key"] for o in printed["outcomes"]}) == len(rows)
    assert printed["counts"]["failed"] == 3 * kept // 2


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in --json output: {keys}"
    return dict(pairs)


def test_maintain_json_shows_each_snapshot_outcome_once(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(6)
    broken = stream.stores[1]
    (stream.storage.root / stream.committed[broken][2].path).unlink()
    done = statestore(
        stream, "maintain", "--execute", "--no-cleanup", "--min-deltas", "5", "--json"
    )
    assert done.exit_code != 0, done.output  # a store failed
    report = json.loads(done.output, object_pairs_hook=_unique_keys)["snapshots"]
    assert set(report) == {"run_id", "outcomes", "counts"}
    assert sorted(o["key"] for o in report["outcomes"]) == sorted(
        str(stream.key(s)) for s in stream.stores
    )
    assert [o["key"] for o in report["outcomes"] if o["status"] == "failed"] == [
        str(stream.key(broken))
    ]
    assert report["counts"]["bytes_written"] > 0
    assert report["counts"] | {"bytes_written": 0} == {
        "written": 2,
        "recorded": 0,
        "up_to_date": 0,
        "busy": 0,
        "failed": 1,
        "bytes_written": 0,
    }


class SlowSnapshots(LocalStorage):
    """A stream's local files, each snapshot written after ``seconds`` (a large store's),
    and after each wait an intruder (another run) tries every lease of ``keys``, keeping
    what it takes in ``taken``: what a long chunk leaves unprotected."""

    def __init__(
        self, stream: StoreStream, ttl: timedelta, seconds: float, keys: list[StoreKey]
    ) -> None:
        super().__init__(stream.storage.root)
        self.catalog, self.ttl, self.seconds, self.keys = stream.catalog, ttl, seconds, keys
        self.taken: dict[StoreKey, Lease] = {}

    def write_if_absent(self, path: str, data: bytes) -> None:
        self._slow(path)
        super().write_if_absent(path, data)

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        self._slow(path)
        super().write_stream_if_absent(path, source, size)

    def _slow(self, path: str) -> None:
        if not path.endswith(".snapshot"):
            return
        time.sleep(self.seconds)
        for key in self.keys:
            if key not in self.taken:
                lease = self.catalog.try_acquire_lease(key, "intruder", self.ttl)
                if lease is not None:
                    self.taken[key] = lease


class SteppedSnapshots(LocalStorage):
    """A stream's local files, each snapshot written after ``step`` seconds of ``clock`` (a
    large store's, without wall-clock margins)."""

    def __init__(self, stream: StoreStream, step: float) -> None:
        super().__init__(stream.storage.root)
        self.step, self.clock = step, LeaseClock()

    def write_if_absent(self, path: str, data: bytes) -> None:
        if path.endswith(".snapshot"):
            self.clock.step(self.step)
        super().write_if_absent(path, data)

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        if path.endswith(".snapshot"):
            self.clock.step(self.step)
        super().write_stream_if_absent(path, source, size)


def test_a_chunk_longer_than_the_lease_ttl_keeps_its_leases(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, one chunk of three stores, each snapshot taking 0.7 of the lease's time to
    live: the chunk outlasts its leases, which it renews between stores, so no snapshot ends
    after its leases could have run out, and every lease goes back at the end."""
    stream = make_stream()
    stream.run(5)
    ttl = timedelta(minutes=1)
    keys = [stream.key(s) for s in stream.stores]
    slow = SteppedSnapshots(stream, 0.7 * ttl.total_seconds())
    slow.clock.spy(stream.catalog, monkeypatch)
    fleet = Fleet(stream.catalog, open_storage=lambda root: slow, owner="tests")
    report = snapshot_pass(fleet, dataclasses.replace(POLICY, lease_ttl=ttl), workers=1)
    assert slow.clock.stepped > 2 * ttl.total_seconds()  # outlasted the leases
    assert slow.clock.renewals >= 2 and slow.clock.longest < ttl.total_seconds()
    assert report.count(SnapshotStatus.WRITTEN) == len(keys)
    for key in keys:  # and every lease went back at the end
        lease = stream.catalog.try_acquire_lease(key, "after", timedelta(minutes=1))
        assert lease is not None
        stream.catalog.release_lease(lease)


def test_a_lease_lost_mid_chunk_leaves_its_store_to_the_run_that_took_it(
    make_stream: Callable[..., StoreStream],
) -> None:
    """The first snapshot outlasts the whole lease time to live and another run takes every
    lease meanwhile: the written snapshot is not recorded (FAILED, naming its file), the
    stores not yet started are BUSY, and the next pass records the file."""
    stream = make_stream()
    stream.run(5)
    ttl = timedelta(seconds=1)  # the shortest a policy allows
    keys = [stream.key(s) for s in stream.stores]
    slow = SlowSnapshots(stream, ttl, 1.3, keys)
    fleet = Fleet(stream.catalog, open_storage=lambda root: slow, owner="tests")
    report = snapshot_pass(fleet, dataclasses.replace(POLICY, lease_ttl=ttl), workers=1)
    assert set(slow.taken) == set(keys)
    first, *rest = report.outcomes
    assert first.status is SnapshotStatus.FAILED and first.path and first.error
    assert "lease ran out" in first.error and first.path in first.error
    assert (stream.storage.root / first.path).exists()
    assert [o.status for o in rest] == [SnapshotStatus.BUSY] * len(rest)
    assert all(f.kind.value == "delta" for v in retained(stream) for f in v.files)
    stream.catalog.release_leases(list(slow.taken.values()))  # the intruder's run ends
    again = snapshot_pass(fleet_on(stream), POLICY)
    statuses = {o.key: o.status for o in again.outcomes}
    assert statuses.pop(first.key) is SnapshotStatus.RECORDED
    assert set(statuses.values()) == {SnapshotStatus.WRITTEN}


def retained(stream: StoreStream) -> list[RetainedVersion]:
    return [
        v for store in stream.stores for v in stream.catalog.retained_versions(stream.root, store)
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("catalog", ["postgresql"], indirect=True)
def test_a_chunk_whose_recording_fails_names_its_stores_and_files(
    make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    """The catalog refuses the chunk's one recording transaction (a constraint the snapshot
    rows break): the error names the chunk's stores and the snapshot files written, which
    stay unrecorded until a later pass records them."""
    stream = make_stream()
    stream.run(5)
    refuse = sa.text(
        "ALTER TABLE checkpoint_files ADD CONSTRAINT no_snapshots CHECK (kind <> 'snapshot') "
        "NOT VALID"
    )
    with catalog.engine.begin() as connection:
        connection.execute(refuse)
    try:
        with pytest.raises(CommitConflict) as failed:
            snapshot_pass(fleet_on(stream), POLICY, workers=1)
    finally:
        with catalog.engine.begin() as connection:
            connection.execute(sa.text("ALTER TABLE checkpoint_files DROP CONSTRAINT no_snapshots"))
    message = str(failed.value)
    written = sorted(
        p.relative_to(stream.storage.root).as_posix()
        for p in stream.storage.root.rglob("*.snapshot")
    )
    assert len(written) == len(stream.stores)
    assert f"3 store(s) of {stream.root}" in message and "no_snapshots" in message
    assert all(str(s) in message for s in stream.stores)
    assert all(path in message for path in written)
    [run] = [r for r in catalog.recent_runs() if r.kind == "snapshot"]
    assert run.outcome == "failed" and run.error and all(p in run.error for p in written)
    again = snapshot_pass(fleet_on(stream), POLICY)
    assert {o.status for o in again.outcomes} == {SnapshotStatus.RECORDED}
