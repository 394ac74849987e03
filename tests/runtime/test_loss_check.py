"""The loss check of a failed batch (:func:`state_runtime.runtime.loss.lost_state`) over a
snapshot recorded as failed verification: on real files and a real catalog, without Spark.

It reads such a snapshot again only when the catalog's chain has a file gone or damaged (a
sink's failure over a complete chain reads nothing: failed before its fix, review of the
expired branch), and one that reads intact is the base, also below a verified snapshot that
is gone (i34base). One that storage cannot read now (an S3 outage on that object) is no
base, but no proof of a loss below it either (i34base: the loss was reported); it neither
hides another store's loss nor stops a restore whose chain does not need it (review of the
fixloss branch, which raised). The two i34base cases failed before their fix.

Review of i34base (fixbase; each failed before its fix): an unreadable snapshot is no verdict
only if the version loads with it taken as intact (one that could not load it anyway hid the
loss, and restore bade try again); a failed read of a snapshot the load does not need is no
damage and no failed verification; ``damaged_files`` takes a failed snapshot that reads intact
now as no damage (its old note was classified, then made the walks call the store lost); and
the chain walk shared by restore, the loss check and classify is tested directly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, FileRecord, FileState, FoundProblem, Verification
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.errors import (
    CheckpointFileCorrupt,
    LineageBroken,
    MaintenanceRefused,
    StateLost,
    StorageUnavailable,
)
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance import Fleet
from state_runtime.maintenance.chains import Verified, Walk, walk_chain
from state_runtime.maintenance.damage import Fate, classify, damaged_files
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.restore import plan_restore, restore_query
from state_runtime.runtime.loss import lost_state
from state_runtime.storage import LocalStorage
from state_runtime.store.file_verification import MISSING
from tests.maintenance.streams import StoreStream

A, B = StoreId(0, 0), StoreId(0, 1)
TASK = RuntimeError("a task of the batch failed")  # not a loading error: existence checks only


class Throttled(LocalStorage):
    """Local storage whose reads of the paths in ``refused`` fail as S3's do once its
    retries are exhausted."""

    refused: frozenset[str] = frozenset()

    def read(self, path: str) -> bytes:
        if path in self.refused:
            raise StorageUnavailable("S3 read failed after 5 tries: SlowDown", path=path)
        return super().read(path)


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[StoreStream]:
    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}", upgrade=True)
    yield StoreStream(catalog, Throttled(tmp_path / "ckpt"), [A, B])
    catalog.close()


def failed_snapshot(
    stream: StoreStream, version: int, store: StoreId = A, problem: str | None = "checksum differs"
) -> Path:
    """A snapshot of ``version`` written, recorded, and recorded as failed verification
    (``problem``; None: recorded as verified)."""
    info = stream.committed[store][version - 1]
    snap = stream.provider(store).snapshot(version, info.checkpoint_id)
    stream.catalog.record_files(stream.root, [snap])
    stream.catalog.record_verifications(stream.root, {snap.path: problem})
    return stream.storage.root / snap.path


def flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF
    file.write_bytes(bytes(data))


def delta(stream: StoreStream, version: int, store: StoreId = A) -> Path:
    return stream.storage.root / stream.committed[store][version - 1].path


def refuse_reads(stream: StoreStream, file: Path) -> None:
    assert isinstance(stream.storage, Throttled)
    stream.storage.refused = frozenset({file.relative_to(stream.storage.root).as_posix()})


def check(stream: StoreStream, error: BaseException = TASK) -> StateLost | None:
    bases = {
        s: CheckpointRef(stream.committed[s][-1].version, stream.committed[s][-1].checkpoint_id)
        for s in stream.stores
    }
    return lost_state(stream.catalog, stream.storage, stream.query, stream.batch, bases, error)


def test_a_failure_over_a_complete_chain_reads_no_failed_snapshot(stream: StoreStream) -> None:
    stream.run(6)
    damaged = [failed_snapshot(stream, v) for v in (3, 4, 5)]
    for file in damaged:
        flip(file)
    before = stream.storage.requests.bytes_read
    assert check(stream) is None
    assert stream.storage.requests.bytes_read == before


def test_a_snapshot_intact_again_is_the_base_and_a_loss_above_it_is_named(
    stream: StoreStream,
) -> None:
    stream.run(5)
    failed_snapshot(stream, 3)
    delta(stream, 2).unlink()
    assert stream.loaded(A, 5) == stream.expected(A, 5)  # a cold load loads from the snapshot
    assert check(stream) is None
    flip(delta(stream, 4))  # above the snapshot: the loader fails on it
    lost = check(stream, CheckpointFileCorrupt("bad bytes", path="any"))
    assert isinstance(lost, StateLost)
    assert stream.committed[A][3].path in str(lost)
    assert stream.committed[A][1].path not in str(lost)


def test_a_snapshot_storage_cannot_read_hides_no_loss_of_another_store(
    stream: StoreStream,
) -> None:
    stream.run(5)
    refuse_reads(stream, failed_snapshot(stream, 3, B))  # B's deltas all there
    delta(stream, 2).unlink()  # A's loss: no snapshot covers it
    lost = check(stream)
    assert isinstance(lost, StateLost) and stream.committed[A][1].path in str(lost)


def test_a_snapshot_storage_cannot_read_stops_no_restore_that_does_not_need_it(
    stream: StoreStream,
) -> None:
    stream.run(5)
    refuse_reads(stream, failed_snapshot(stream, 3, B))
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    assert not plan_restore(fleet, stream.root, stream.query, 3, spark_checkpoint="").restarted


def test_a_snapshot_storage_cannot_read_is_no_proof_of_a_loss_below_it(
    stream: StoreStream,
) -> None:
    stream.run(5)
    snapshot = failed_snapshot(stream, 3)  # intact: put back after the failed validation
    delta(stream, 2).unlink()
    assert stream.loaded(A, 5) == stream.expected(A, 5)  # the batch loads
    refuse_reads(stream, snapshot)  # an outage on that one object during the loss check
    assert check(stream) is None
    assert check(stream, CheckpointFileCorrupt("bad bytes", path="any")) is None
    assert not stream.catalog.problems(store=stream.key(A))


def test_a_failed_snapshot_below_a_lost_verified_one_is_judged_again(
    stream: StoreStream,
) -> None:
    stream.run(6)
    failed_snapshot(stream, 2)  # intact: put back after the failed validation
    failed_snapshot(stream, 4, problem=None).unlink()  # the newest verified snapshot, gone
    delta(stream, 1).unlink()
    assert stream.loaded(A, 6) == stream.expected(A, 6)  # the loader reads snapshot 2
    assert check(stream) is None
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    assert not plan_restore(fleet, stream.root, stream.query, 4, spark_checkpoint="").restarted


def mark_deleted(stream: StoreStream, *files: Path) -> None:
    """``files`` deleted as cleanup deletes them: recorded deleted, gone from storage."""
    paths = [f.relative_to(stream.storage.root).as_posix() for f in files]
    with stream.catalog.engine.begin() as connection:
        connection.execute(
            sa.update(checkpoint_files)
            .where(checkpoint_files.c.path.in_(paths))
            .values(state=FileState.DELETED.value)
        )
    for file in files:
        file.unlink()


def restore_last(stream: StoreStream) -> str:
    """Why a restore to the last batch is refused."""
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    with pytest.raises(MaintenanceRefused) as refused:
        plan_restore(fleet, stream.root, stream.query, stream.batch - 1, spark_checkpoint="")
    return str(refused.value)


def test_a_snapshot_storage_cannot_read_hides_no_loss_it_could_not_load_anyway(
    stream: StoreStream,
) -> None:
    """Snapshot 2 cannot be read, but deltas 3 and 4 above it are deleted: the loss stands
    (the check said nothing before the fix)."""
    stream.run(6)
    snapshot = failed_snapshot(stream, 2)  # intact: put back after the failed validation
    failed_snapshot(stream, 4, problem=None).unlink()  # the newest verified snapshot, gone
    mark_deleted(stream, *(delta(stream, v) for v in (1, 2, 3, 4)))
    with pytest.raises(LineageBroken):
        stream.loaded(A, 6)
    refuse_reads(stream, snapshot)
    lost = check(stream)
    assert isinstance(lost, StateLost) and lost.store == stream.key(A)
    assert "try again" not in restore_last(stream)


def test_a_snapshot_storage_cannot_read_above_a_broken_delta_hides_no_loss_above_it(
    stream: StoreStream,
) -> None:
    """Snapshot 8 cannot be read, below the loss of delta 9: the check said nothing before
    the fix (it looked no further than delta 5), and restore's refusal bade try again."""
    stream.run(10)
    failed_snapshot(stream, 3, problem=None)
    refuse_reads(stream, failed_snapshot(stream, 8))  # intact: put back after the validation
    delta(stream, 5).unlink()
    delta(stream, 9).unlink()
    lost = check(stream)
    assert isinstance(lost, StateLost) and lost.store == stream.key(A)
    refusal = restore_last(stream)
    assert delta(stream, 5).name in refusal and "try again" not in refusal


def test_a_verified_snapshot_storage_cannot_read_over_a_chain_that_loads_is_no_damage(
    stream: StoreStream,
) -> None:
    """Deep check and restore over an unreadable verified snapshot the deltas below replace:
    no problem recorded, no failed verification (both were, before the fix)."""
    stream.run(5)
    snapshot = failed_snapshot(stream, 4, problem=None)
    refuse_reads(stream, snapshot)
    assert check(stream, CheckpointFileCorrupt("bad bytes", path="any")) is None
    assert not stream.catalog.problems(store=stream.key(A))
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    plan = plan_restore(fleet, stream.root, stream.query, stream.batch - 1, spark_checkpoint="")
    assert not plan.damaged
    restore_query(fleet, plan, MaintenancePolicy())
    (record,) = [
        f
        for f in stream.catalog.store_files(stream.root, A)
        if f.path == snapshot.relative_to(stream.storage.root).as_posix()
    ]
    assert record.verification is not Verification.FAILED


def record_of(stream: StoreStream, file: Path) -> FileRecord:
    path = file.relative_to(stream.storage.root).as_posix()
    (record,) = [f for f in stream.catalog.store_files(stream.root, A) if f.path == path]
    return record


def test_the_chain_walk_names_passed_over_broken_and_unreadable_files(
    stream: StoreStream,
) -> None:
    """walk_chain as restore, the loss check and classify take it: a damaged base snapshot
    is passed over for the chain below it; a missing delta breaks that chain; a snapshot
    storage cannot read is named only when the version loads with it taken as intact."""
    stream.run(8)
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    failed_snapshot(stream, 3, problem=None)
    six = failed_snapshot(stream, 6, problem=None)
    seven = failed_snapshot(stream, 7)
    backup = seven.read_bytes()
    flip(six)
    flip(seven)  # failed, and damaged still: no base

    def walk() -> Walk:
        return walk_chain(fleet, stream.key(A), 8, Verified())

    first = walk()
    assert first.loads and first.broken is None and first.unreadable is None
    assert [(r.path, p.split(":")[0]) for r, p in first.passed_over] == [
        (record_of(stream, six).path, "corrupt checkpoint file")
    ]
    delta(stream, 5).unlink()
    second = walk()
    assert not second.loads and second.unreadable is None
    assert second.broken == (record_of(stream, delta(stream, 5)), MISSING)
    seven.write_bytes(backup)  # put back after the failed validation: the base again
    assert walk().loads
    refuse_reads(stream, seven)
    third = walk()
    assert not third.loads and third.unreadable == record_of(stream, seven)
    delta(stream, 8).unlink()  # now snapshot 7 could not load version 8 either
    assert walk().unreadable is None


def test_a_failed_snapshot_intact_now_is_no_damage_to_classify(stream: StoreStream) -> None:
    """damaged_files over a failed snapshot that reads intact now (put back) and a verified
    one gone: only the gone one is damage, and only older versions needed it (before the fix
    the old note classified the intact one, then made the walks call both lost)."""
    stream.run(6)
    four = failed_snapshot(stream, 4, problem=None)
    four.unlink()
    failed_snapshot(stream, 5)  # intact: put back after the failed validation
    delta(stream, 1).unlink()
    assert stream.loaded(A, 6) == stream.expected(A, 6)
    gone = record_of(stream, four)
    stream.catalog.add_problems(stream.key(A), [FoundProblem(MISSING, gone.path, 4)])
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage, owner="tests")
    assert classify(fleet, gone, MISSING).fate is Fate.OLDER_ONLY
    report = damaged_files(fleet, MaintenancePolicy(), [stream.key(A)])
    assert [(d.file.path, d.fate) for d in report.damages] == [(gone.path, Fate.OLDER_ONLY)]
