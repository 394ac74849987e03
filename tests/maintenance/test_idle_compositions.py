"""A version that changed nothing is a commit of its parent's checkpoint, not a file, so a
batch with idle stores commits again whatever maintenance did in between (restore, cleanup
past the grace or at zero grace, a snapshot superseding it), and a byte-identical retry of a
commit stays a no-op. The commit log, not a file row's state, decides what cleanup keeps.
A damaged file's classification (repair, explain, validate, restore's batch) passes over the
idle versions of a chain as the loader does. SQLite and PostgreSQL catalogs; real files on
local storage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from state_runtime import CheckpointInfo
from state_runtime.catalog import RetentionPolicy
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fate,
    MaintenancePolicy,
    RepairStatus,
    classify,
    cleanup_pass,
    damaged_files,
    explain_file,
    plan_restore,
    repair_pass,
    restore_query,
    run_checks,
    snapshot_pass,
)
from state_runtime.store.file_verification import MISSING
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import assert_retained_versions_load, on_disk
from tests.maintenance.test_safety import damage, relative
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=3)
LATER = datetime.now(UTC) + timedelta(days=1)
ZERO = MaintenancePolicy(
    retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0)),
    min_window=timedelta(0),
)


def _write(stream: StoreStream, store: StoreId, puts: dict[str, int]) -> CheckpointInfo:
    """A task attempt at the store's next version, by a fresh provider (another process)."""
    parent = stream.committed[store][-1]
    handle = stream.provider(store).get_store(parent.version, parent.checkpoint_id)
    for key, value in puts.items():
        handle.put((key,), (value,))
    return handle.commit()


def _attempt(stream: StoreStream, changed: StoreId) -> list[CheckpointInfo]:
    """One attempt at the next batch in which only ``changed`` changes."""
    return [_write(stream, s, {"fresh": 1} if s == changed else {}) for s in stream.stores]


def _committed(stream: StoreStream, infos: list[CheckpointInfo]) -> None:
    """Commit ``infos`` as the stream's next batch and keep the model in step."""
    stream.catalog.commit_batch(stream.root, stream.query, stream.batch, infos)
    for info in infos:
        state = dict(stream.states[info.store][-1])
        if info.has_file:
            state["fresh"] = 1
        stream.committed[info.store].append(info)
        stream.states[info.store].append(state)
    stream.batch += 1


def test_an_idle_version_is_recorded_as_a_commit_of_its_parents_checkpoint(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(idle=frozenset({2}))
    stream.run(3)
    store = stream.stores[0]
    idle = stream.committed[store][2]
    assert not idle.has_file
    paths = {f.path for f in stream.catalog.store_files(stream.root, store)}
    assert idle.path not in paths and len(paths) == 2  # versions 1 and 2 only
    assert stream.catalog.idle_versions(stream.root, store) == {3}
    with stream.catalog.engine.connect() as connection:
        entry = connection.execute(
            sa.text("SELECT checkpoint_id, file_id FROM commit_log WHERE version = 3")
        ).all()
    assert {tuple(row) for row in entry} == {
        (stream.committed[s][1].checkpoint_id, None) for s in stream.stores
    }
    (history,) = stream.catalog.version_history(stream.root, stores=[store], limit=1)
    assert history.ref == idle.ref and history.files == ()
    assert history.rows == stream.committed[store][1].rows


def test_a_byte_identical_retry_is_a_no_op_after_a_snapshot_and_cleanup(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Versions 3 and 4 changed nothing; a snapshot at 10 supersedes them and cleanup sweeps
    what lies below it. Retrying every batch's commit with the same ids changes nothing."""
    stream = make_stream(idle=frozenset({2, 3, 9}))
    stream.run(10)
    fleet = fleet_on(stream)
    snapshot_pass(fleet, POLICY)
    stream.run(2)
    report = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    assert report.deleted and not report.failed
    for batch in range(stream.batch):
        infos = [stream.committed[s][batch] for s in stream.stores]
        again = stream.catalog.commit_batch(stream.root, stream.query, batch, infos)
        assert (again.replaced, again.orphaned_files) == ({}, 0)
    assert_retained_versions_load(stream)


def test_an_idle_batch_replays_after_a_restore_and_cleanup_past_the_grace(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(idle=frozenset({5}))
    stream.run(6)
    fleet = fleet_on(stream)
    plan = plan_restore(fleet, stream.root, stream.query, 4, spark_checkpoint="")
    restore_query(fleet, plan, POLICY)
    for store in stream.stores:
        stream.committed[store].pop()
        stream.states[store].pop()
    stream.batch = 5
    cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    replay = [_write(stream, s, {}) for s in stream.stores]
    assert not any(info.has_file for info in replay)
    _committed(stream, replay)
    assert_retained_versions_load(stream)
    assert run_checks(fleet_on(stream), POLICY).ok


@pytest.mark.parametrize(
    ("policy", "now"), [(POLICY, LATER), (ZERO, None)], ids=["past-the-grace", "zero-grace"]
)
def test_a_batch_whose_files_were_swept_before_its_commit_replays(
    make_stream: Callable[..., StoreStream],
    policy: MaintenancePolicy,
    now: datetime | None,
) -> None:
    """A driver recorded its batch's files and died before committing (or maintenance at
    zero grace ran between the two): cleanup deletes the changed store's file as never
    committed. The replay writes it again under a new id; the idle stores' versions are the
    same as before, and the batch commits."""
    stream = make_stream()
    stream.run(3)
    changed = stream.stores[0]
    first = _attempt(stream, changed)
    stream.catalog.record_files(stream.root, first)
    report = cleanup_pass(fleet_on(stream), policy, now=now, dry_run=False)
    assert first[0].path in {v.file.path for v in report.deleted}
    replay = _attempt(stream, changed)
    assert [i.path for i in replay[1:]] == [i.path for i in first[1:]]
    _committed(stream, replay)
    assert_retained_versions_load(stream)
    assert run_checks(fleet_on(stream), POLICY).ok


def test_cleanup_never_deletes_what_the_commit_log_needs_whatever_the_state_says(
    make_stream: Callable[..., StoreStream],
) -> None:
    """One UPDATE marks every file of one store orphan. The next cleanup past every window
    deletes none of the files its retained versions load from; a snapshot it names is kept
    as their base (the deltas below it, superseded, may go)."""
    stream = make_stream(idle=frozenset({4}))
    stream.run(6)
    fleet = fleet_on(stream)
    snapshot_pass(fleet, POLICY)
    stream.run(3)
    victim = stream.stores[0]
    with stream.catalog.engine.begin() as connection:
        store_id = connection.execute(
            sa.text(
                "SELECT store_id FROM stores WHERE operator_id = :o AND partition_id = :p "
                "AND store_name = :n"
            ),
            {"o": victim.operator_id, "p": victim.partition_id, "n": victim.store_name},
        ).scalar_one()
        connection.execute(
            sa.text("UPDATE checkpoint_files SET state = 'orphan' WHERE store_id = :s"),
            {"s": store_id},
        )
    kept = {i.path for i in stream.committed[victim][6:] if i.has_file}
    snapshot = next(
        f.path
        for f in stream.catalog.store_files(stream.root, victim)
        if f.version == 6 and f.kind.value == "snapshot"
    )
    report = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    deleted = {v.file.path for v in report.deleted}
    assert not deleted & (kept | {snapshot})
    assert kept | {snapshot} <= on_disk(stream)
    assert_retained_versions_load(stream)


@pytest.mark.parametrize("idle", [frozenset({5, 6}), frozenset({6, 7})], ids=["below", "at"])
def test_a_damaged_snapshot_over_idle_versions_is_repairable_by_every_tool(
    make_stream: Callable[..., StoreStream], idle: frozenset[int]
) -> None:
    """Versions 6 and 7 (or 7 and 8, the snapshot's own) changed nothing; the snapshot at 8 is
    bit-flipped. Its version still loads from the deltas below it (the idle versions need no
    file): validate, explain and repair's dry run call it repairable, and repair rebuilds it."""
    stream = make_stream(idle=idle)
    stream.run(8)
    fleet = fleet_on(stream)
    snapshot_pass(fleet, POLICY)
    store = stream.stores[0]
    [snap] = (stream.storage.root / store.directory).glob("*.snapshot")
    assert snap.name.startswith("8_")
    damage(snap)
    path = relative(stream, snap)

    full = replace(POLICY, verify_sample_percent=100)  # damaged in place, size kept
    [finding] = run_checks(fleet_on(stream), full).validation.errors
    assert finding.damage is not None and finding.damage.fate is Fate.REPAIRABLE, finding
    explained = explain_file(fleet_on(stream), stream.root, path, POLICY)
    assert explained.damage is not None and explained.damage.fate is Fate.REPAIRABLE
    assert [d.file.path for d in damaged_files(fleet, POLICY).of(Fate.REPAIRABLE)] == [path]

    [outcome] = repair_pass(fleet_on(stream), POLICY).outcomes
    assert outcome.status is RepairStatus.REPAIRED, outcome
    assert run_checks(fleet_on(stream), POLICY).ok
    assert stream.loaded(store, 8) == stream.expected(store, 8)


def test_a_lost_delta_below_idle_versions_names_the_newest_intact_batch(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Versions 5 and 6 changed nothing and version 7 did; version 7's delta goes. Batch 5
    (version 6, idle) is the newest batch whose stores all load: the classification names
    it, as restore computes it, and restore accepts it."""
    stream = make_stream(idle=frozenset({4, 5}))
    stream.run(7)
    store = stream.stores[0]
    gone = stream.committed[store][6]
    (stream.storage.root / gone.path).unlink()
    fleet = fleet_on(stream)
    record = next(f for f in stream.catalog.store_files(stream.root, store) if f.path == gone.path)
    damage_found = classify(fleet, record, MISSING, spark_checkpoint="")
    assert (damage_found.fate, damage_found.batch) == (Fate.RESTORABLE, 5), damage_found
    assert "--to-batch 5 --no-spark-checkpoint --execute" in damage_found.command
    plan = plan_restore(fleet, stream.root, stream.query, 5, spark_checkpoint="")
    assert not plan.lost
