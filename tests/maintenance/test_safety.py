"""Maintenance never destroys the last way back: damaged, missing and unverified files on real
stores, with real catalogs (SQLite and PostgreSQL).

A snapshot supersedes deltas only once verified; a store with an open validation problem is
held (only orphans may go); repair rebuilds a damaged snapshot from its deltas; every surface
reports the same status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from state_runtime.catalog import FileState, Verdict, Verification
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.identity import FileKind, StoreId
from state_runtime.maintenance import (
    Fate,
    MaintenancePolicy,
    RepairStatus,
    SnapshotStatus,
    StoreStatus,
    cleanup_pass,
    explain_file,
    repair_pass,
    run_checks,
    snapshot_pass,
    store_reports,
    validate_stores,
)
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import assert_retained_versions_load, on_disk
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=5)
FULL = replace(POLICY, verify_sample_percent=100)
"""A full validation: :func:`damage` keeps a verified file's size, so only reading it (the
sample, in time, or ``--full`` at once) finds it."""
LATER = datetime.now(UTC) + timedelta(days=1)  # every file is past the window


def snapshotted(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Three stores, 8 versions, a verified snapshot at version 6, validated once."""
    stream = make_stream()
    stream.run(6)
    report = snapshot_pass(fleet_on(stream), POLICY)
    assert report.count(SnapshotStatus.WRITTEN) == 3
    stream.run(2)
    assert run_checks(fleet_on(stream), POLICY).ok
    return stream


def snapshot_file(stream: StoreStream, store: StoreId) -> Path:
    [found] = (stream.storage.root / store.directory).glob("*.snapshot")
    return found


def damage(path: Path) -> None:
    """Overwrite a few bytes in the middle of the file, as a bad disk or a stray tool does."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xde\xad\xbe\xef"
    path.write_bytes(bytes(data))


def relative(stream: StoreStream, path: Path) -> str:
    return path.relative_to(stream.storage.root).as_posix()


def planned(stream: StoreStream, policy: MaintenancePolicy = POLICY) -> dict[str, Verdict]:
    report = cleanup_pass(fleet_on(stream), policy, now=LATER)
    return {v.file.path: v.verdict for v in report.planned}


def statuses(stream: StoreStream) -> dict[StoreId, StoreStatus]:
    return {r.key.store: r.status.status for r in store_reports(fleet_on(stream), POLICY)}


def test_a_corrupt_latest_snapshot_keeps_its_deltas_until_repaired(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream)
    store = stream.stores[0]
    deltas = [info.path for info in stream.committed[store]]
    snap = snapshot_file(stream, store)
    assert set(deltas[:6]) <= set(planned(stream))  # verified: the snapshot supersedes 1..6

    damage(snap)
    fleet = fleet_on(stream)
    checks = run_checks(fleet, FULL)
    [finding] = checks.validation.errors
    assert finding.path == relative(stream, snap) and "checksum" in finding.problem

    # The damaged snapshot supersedes nothing, the store is held: none of its files may go.
    plan = cleanup_pass(fleet, POLICY, now=LATER)
    assert not {v.file.path for v in plan.planned} & {*deltas, relative(stream, snap)}
    [held] = plan.held
    assert held.key == stream.key(store) and relative(stream, snap) in held.reason
    assert {v.file.key.store for v in plan.planned} == set(stream.stores[1:])  # others go on
    verdicts = {
        v.file.path: v
        for v in stream.catalog.file_verdicts(POLICY.retention, root=stream.root, now=LATER)
    }
    assert verdicts[relative(stream, snap)].verdict is Verdict.DAMAGED
    assert {verdicts[p].verdict for p in deltas} == {Verdict.NEEDED}  # versions 7, 8 need 1..8

    [report] = [r for r in store_reports(fleet, POLICY) if r.key.store == store]
    assert report.status.status is StoreStatus.BROKEN
    assert relative(stream, snap) in report.status.reason and "checksum" in report.status.reason
    assert report.status.since is not None and report.health.deltas_since_snapshot == 8
    found = explain_file(fleet, stream.root, relative(stream, snap), POLICY)
    explained = found.explanation
    assert explained.verdict is Verdict.DAMAGED
    assert "no retained version is lost" in explained.reason
    assert found.damage is not None and found.damage.fate is Fate.REPAIRABLE
    command = f"statestore --root {stream.root} repair --store {store} --execute"
    assert found.damage.command == command
    assert f"run `{command}`" in report.status.reason  # as validate said

    cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    assert set(deltas) <= on_disk(stream) and snap.exists()
    assert_retained_versions_load(stream)

    repaired = repair_pass(fleet, POLICY)
    [outcome] = repaired.outcomes
    assert outcome.status is RepairStatus.REPAIRED and outcome.path == relative(stream, snap)
    [repair] = stream.catalog.repairs(stream.root)
    assert repair.finished_at is not None and repair.removed_at is not None
    assert repair.damaged_size is not None and repair.damaged_sha256 is not None
    record = next(
        f for f in stream.catalog.store_files(stream.root, store) if f.path == repair.path
    )
    assert record.verification is Verification.VERIFIED and record.checksum != repair.old_checksum
    assert statuses(stream)[store] is StoreStatus.HEALTHY
    assert not stream.catalog.problems(root=stream.root)

    done = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    assert set(deltas[:6]) <= {v.file.path for v in done.deleted}
    assert not done.held
    assert_retained_versions_load(stream)
    assert stream.loaded(store, 6) == stream.expected(store, 6)  # from the rebuilt snapshot


def test_the_snapshot_pass_does_not_count_on_a_damaged_latest_snapshot(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[StoreId(0, 0)])
    stream.run(6)
    snapshot_pass(fleet_on(stream), POLICY)
    store = stream.stores[0]
    damage(snapshot_file(stream, store))
    assert not validate_stores(fleet_on(stream), FULL).ok
    again = snapshot_pass(fleet_on(stream), POLICY)  # due again: no verified snapshot
    [failed] = again.failed
    assert "failed verification after it was written" in (failed.error or "")
    assert "statestore repair" in (failed.error or "")
    assert not {i.path for i in stream.committed[store]} & set(planned(stream))
    assert statuses(stream)[store] is StoreStatus.BROKEN


def test_a_snapshot_written_but_never_verified_supersedes_nothing(
    make_stream: Callable[..., StoreStream],
) -> None:
    """The snapshot pass crashed between writing a snapshot and verifying it."""
    stream = make_stream()
    stream.run(6)
    store = stream.stores[0]
    latest = stream.committed[store][-1]
    info = stream.provider(store).snapshot(latest.version, latest.checkpoint_id)
    stream.catalog.record_snapshot(stream.root, info)  # recorded, not verified
    stream.run(2)
    deltas = [i.path for i in stream.committed[store]]
    plan = planned(stream)
    assert not set(deltas) & set(plan) and info.path not in plan
    verdicts = {
        v.file.path: v
        for v in stream.catalog.file_verdicts(POLICY.retention, root=stream.root, now=LATER)
    }
    assert verdicts[info.path].verdict is Verdict.UNVERIFIED
    assert "not verified" in verdicts[info.path].reason
    [report] = [r for r in store_reports(fleet_on(stream), POLICY) if r.key.store == store]
    assert report.status.status is StoreStatus.UNKNOWN
    assert report.health.deltas_since_snapshot == 8

    assert validate_stores(fleet_on(stream), POLICY).ok  # verifies it: now it counts
    assert set(deltas[:6]) <= set(planned(stream))
    assert statuses(stream)[store] is StoreStatus.HEALTHY


def test_the_snapshot_pass_verifies_a_snapshot_an_earlier_run_left_unverified(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[StoreId(0, 0)])
    stream.run(6)
    store = stream.stores[0]
    latest = stream.committed[store][-1]
    info = stream.provider(store).snapshot(latest.version, latest.checkpoint_id)
    stream.catalog.record_snapshot(stream.root, info)
    report = snapshot_pass(fleet_on(stream), POLICY)
    assert [o.status for o in report.outcomes] == [SnapshotStatus.RECORDED]
    [record] = [f for f in stream.catalog.store_files(stream.root, store) if f.path == info.path]
    assert record.verification is Verification.VERIFIED and record.verified_at is not None


def test_a_truncated_delta_holds_the_store_until_a_validation_passes(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = snapshotted(make_stream)
    store = stream.stores[1]
    orphan = stream.abandoned_attempt(store)
    stream.commit()  # the attempt loses: an orphan of a held store may still go
    newest = stream.committed[store][-2]  # version 8: needed by versions 9 and 8
    path = stream.storage.root / newest.path
    original = path.read_bytes()
    path.write_bytes(original[:100])

    assert not run_checks(fleet_on(stream), POLICY).ok
    [report] = [r for r in store_reports(fleet_on(stream), POLICY) if r.key.store == store]
    assert report.status.status is StoreStatus.BROKEN
    assert report.status.reason.startswith(
        f"delta {newest.path} (version 8) is damaged: size is 100 bytes, the catalog recorded "
        f"{newest.bytes_written}; the store does not load; batch 6 is the newest batch of query "
        "query-1 whose stores all load"
    )
    plan = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    mine = {v.file.path: v.verdict for v in plan.planned if v.file.key.store == store}
    assert mine == {orphan.path: Verdict.DELETABLE_ORPHAN}
    verdicts = {
        v.file.path: v.verdict
        for v in stream.catalog.file_verdicts(POLICY.retention, root=stream.root, now=LATER)
    }
    assert verdicts[stream.committed[store][0].path] is Verdict.HELD

    explained = explain_file(fleet_on(stream), stream.root, newest.path, POLICY).explanation
    assert explained.verdict is Verdict.DAMAGED and "size is 100 bytes" in explained.reason
    assert "lost: retained versions 8..9" in explained.reason

    path.write_bytes(original)  # restored from a backup
    assert run_checks(fleet_on(stream), POLICY).ok
    assert statuses(stream)[store] is StoreStatus.HEALTHY
    [resolved] = stream.catalog.problems(root=stream.root, only_open=False)
    assert resolved.path == newest.path and resolved.resolved_at is not None
    assert (resolved.resolution or "").startswith("no longer found by validation run")
    done = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False)
    assert stream.committed[store][0].path in {v.file.path for v in done.deleted}
    assert_retained_versions_load(stream)


def test_a_missing_delta_is_never_called_needed(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(6)
    store = stream.stores[2]
    gone = stream.committed[store][4]  # version 5: versions 6 and 5 load through it
    (stream.storage.root / gone.path).unlink()
    fleet = fleet_on(stream)
    before = stream.catalog.explain(stream.root, gone.path, POLICY.retention)
    assert before.verdict is Verdict.NEEDED  # the catalog alone cannot know
    explained = explain_file(fleet, stream.root, gone.path, POLICY).explanation
    assert explained.verdict is Verdict.MISSING
    assert explained.reason.startswith("delta file is missing from storage")
    assert "lost: retained versions 5..6" in explained.reason

    assert not validate_stores(fleet, POLICY).ok
    recorded = stream.catalog.explain(stream.root, gone.path, POLICY.retention)
    assert recorded.verdict is Verdict.MISSING  # now the catalog knows
    [report] = [r for r in store_reports(fleet, POLICY) if r.key.store == store]
    assert report.status.status is StoreStatus.BROKEN
    assert report.status.reason.startswith(
        f"delta {gone.path} (version 5) is missing from storage; the store does not load; "
        "batch 3 is the newest batch of query query-1 whose stores all load"
    )
    held = cleanup_pass(fleet, POLICY, now=LATER).held
    assert [h.key.store for h in held] == [store]

    key = stream.key(store)
    assert stream.catalog.resolve_problems(key, "resolved by hand: accepted the loss") == 1
    assert not cleanup_pass(fleet, POLICY, now=LATER).held
    assert statuses(stream)[store] is StoreStatus.HEALTHY
    assert not validate_stores(fleet, POLICY).ok  # the next validation finds it again
    assert statuses(stream)[store] is StoreStatus.BROKEN


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_an_interrupted_repair_is_resumed_without_loss(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repair process dies right after deleting the damaged file (a real exception out
    of the write); every retained version still loads, and the next run finishes it."""
    stream = snapshotted(make_stream)
    store = stream.stores[0]
    snap = snapshot_file(stream, store)
    damage(snap)
    assert not validate_stores(fleet_on(stream), FULL).ok
    storage = stream.storage

    def crash(path: str, data: bytes) -> None:
        raise KeyboardInterrupt("killed between delete and write")

    monkeypatch.setattr(storage, "write_if_absent", crash)
    with pytest.raises(KeyboardInterrupt):
        repair_pass(fleet_on(stream), POLICY)
    monkeypatch.undo()
    assert not snap.exists()
    [repair] = stream.catalog.repairs(stream.root)
    assert repair.removed_at is not None and repair.finished_at is None
    assert_retained_versions_load(stream)
    assert relative(stream, snap) not in planned(stream)
    assert not {i.path for i in stream.committed[store]} & set(planned(stream))

    [outcome] = repair_pass(fleet_on(stream), POLICY).outcomes
    assert outcome.status is RepairStatus.REPAIRED
    [finished] = stream.catalog.repairs(stream.root)
    assert finished.finished_at is not None and finished.damaged_sha256 == repair.damaged_sha256
    assert snap.exists() and validate_stores(fleet_on(stream), POLICY).ok
    assert_retained_versions_load(stream)


def test_an_upgraded_legacy_snapshot_counts_only_once_validated(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A catalog from before verification holds snapshots nobody verified (migration 0006
    marks them unverified): cleanup keeps what they would replace until validation checks
    them."""
    stream = make_stream(stores=[StoreId(0, 0)])
    stream.run(6)
    snapshot_pass(fleet_on(stream), POLICY)
    stream.run(2)
    store = stream.stores[0]
    [snap] = [
        f for f in stream.catalog.store_files(stream.root, store) if f.kind is FileKind.SNAPSHOT
    ]
    with stream.catalog.engine.begin() as connection:  # what the upgrade leaves behind
        connection.execute(
            checkpoint_files.update()
            .where(checkpoint_files.c.path == snap.path)
            .values(verification="unverified", verified_at=None)
        )
    assert not {i.path for i in stream.committed[store]} & set(planned(stream))
    assert validate_stores(fleet_on(stream), POLICY).ok
    assert {i.path for i in stream.committed[store][:6]} <= set(planned(stream))
    assert all(
        f.state == FileState.COMMITTED for f in stream.catalog.store_files(stream.root, store)
    )
