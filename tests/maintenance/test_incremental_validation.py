"""Incremental validation: what changed since the last run is read, a sample of the rest at
the configured rate, and every file not read is checked present (one listing per store)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
import sqlalchemy as sa

from state_runtime.catalog import FoundProblem, Verification
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.errors import InvalidArgument
from state_runtime.identity import FileKind, StoreId
from state_runtime.maintenance import (
    CheckName,
    ChecksReport,
    MaintenancePolicy,
    run_checks,
)
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.validation import files_to_read, validate_stores
from state_runtime.status import StoreStatus
from state_runtime.store import checkpoint_format
from state_runtime.store.checkpoint_format import decode_table
from state_runtime.store.file_verification import MISSING, verify_bytes
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore
from tests.maintenance.test_snapshots import fleet_on
from tests.maintenance.test_validation import POLICY, built

INCREMENTAL = replace(POLICY, verify_sample_percent=0)
FILES = 12
"""Files the retained versions of :func:`built`'s stream load: 4 per store (snapshot 5, 6..8)."""


def validated(stream: StoreStream, policy: MaintenancePolicy) -> ChecksReport:
    """One validation with the storage's request counter reset before it."""
    stream.storage.requests.reset()
    return run_checks(fleet_on(stream), policy)


def test_a_second_validation_with_nothing_new_reads_no_file(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    first = validated(stream, INCREMENTAL).validation.counts()
    # the snapshot pass verified the snapshots; the deltas were never read
    assert (first["files"], first["files_present"]) == (9, 3)
    second = validated(stream, INCREMENTAL)
    assert second.ok and second.validation.counts()["files"] == 0
    assert second.validation.counts()["files_present"] == FILES
    assert stream.storage.requests.counts == {"list": 3}  # one listing per store, no read
    assert stream.storage.requests.bytes_read == 0


def test_a_new_delta_is_read(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    stream.run(1)  # version 9: one new delta per store (version 7 leaves the retained ones)
    report = validated(stream, INCREMENTAL)
    assert report.ok
    assert stream.storage.requests.counts == {"read": 3, "list": 3}
    new = {stream.committed[s][-1].path for s in stream.stores}
    verified = {
        f.path
        for s in stream.stores
        for f in stream.catalog.store_files(stream.root, s)
        if f.verification == Verification.VERIFIED
    }
    assert new <= verified


def test_a_deleted_file_is_found_every_run_without_reading(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    store = stream.stores[1]
    gone = stream.committed[store][6]  # version 7, verified by the first run
    (stream.storage.root / gone.path).unlink()
    for _ in range(2):  # found by the listing, then read again as a failed file: still found
        report = validated(stream, INCREMENTAL)
        [finding] = report.outcome(CheckName.LINEAGE).findings
        assert (finding.path, finding.problem) == (gone.path, MISSING)
        status = {r.key: r.status.status for r in report.health}
        assert status[stream.key(store)] is StoreStatus.BROKEN
        assert not report.ok
    [problem] = stream.catalog.problems(store=stream.key(store))
    assert problem.path == gone.path  # one problem, kept open, not reopened


def test_a_resized_file_is_read(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    newest = stream.committed[stream.stores[2]][-1]
    path = stream.storage.root / newest.path
    path.write_bytes(path.read_bytes()[:100])
    report = validated(stream, INCREMENTAL)
    assert report.validation.counts()["files"] == 1  # (classifying the damage reads more)
    [finding] = report.validation.errors
    assert finding.problem == f"size is 100 bytes, the catalog recorded {newest.bytes_written}"


def corrupt_in_place(stream: StoreStream, store: StoreId | None = None) -> str:
    """Flip a byte of a verified delta (of ``store``, else the first), keeping its size: only
    reading it finds it."""
    delta = stream.committed[store or stream.stores[0]][5]  # version 6
    path = stream.storage.root / delta.path
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    return delta.path


@pytest.mark.parametrize(("percent", "within"), [(100, 1), (50, 2)])
def test_bit_rot_is_found_by_the_sample(
    make_stream: Callable[..., StoreStream], percent: int, within: int
) -> None:
    """At 50% the longest unread half of each store's 4 files is read each run: every file
    within 2 runs; at 100% (a full validation) at once."""
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    rotten = corrupt_in_place(stream)
    assert validated(stream, INCREMENTAL).ok  # the listing cannot see it
    policy = replace(POLICY, verify_sample_percent=percent)
    found = []
    for run in range(within):
        report = validated(stream, policy)
        if run == 0:
            assert report.validation.counts()["files"] == FILES * percent // 100
        found += [f.path for f in report.validation.errors]
    assert set(found) == {rotten}
    assert not validated(stream, INCREMENTAL).ok  # failed: read again every run


def test_a_problem_opened_elsewhere_is_settled_by_reading_its_file(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    key, delta = stream.key(stream.stores[0]), stream.committed[stream.stores[0]][6]
    stream.catalog.add_problems(key, [FoundProblem("seen damaged by a loader", delta.path, 7)])
    report = validated(stream, INCREMENTAL)
    assert stream.storage.requests.counts == {"read": 1, "list": 3}
    assert report.ok and not stream.catalog.problems(store=key)  # intact now: resolved


def test_the_sample_takes_the_longest_unread_first(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    stream.run(1)
    files = sorted(
        stream.catalog.store_files(stream.root, stream.stores[0]), key=lambda f: f.version
    )
    live = [f for f in files if f.version >= 5 and f.state == "committed"]
    read, unread = files_to_read(live, 25, set(), 0.0)
    new = [f for f in live if f.verification != Verification.VERIFIED]
    assert [f.path for f in read] == [f.path for f in live if f in new or f.version == 5]
    assert unread and not set(map(id, read)) & set(map(id, unread))
    assert files_to_read(live, 100, set(), 0.0) == (live, [])


def test_the_rate_is_a_percentage(make_stream: Callable[..., StoreStream]) -> None:
    with pytest.raises(InvalidArgument, match="at most 100"):
        MaintenancePolicy(verify_sample_percent=101)
    with pytest.raises(InvalidArgument, match="STATE_MAINTENANCE_VERIFY_SAMPLE_PERCENT"):
        MaintenancePolicy.from_env({"STATE_MAINTENANCE_VERIFY_SAMPLE_PERCENT": "200"})


def test_the_cli_option_and_full(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)

    def figures(*args: str) -> dict[str, float]:
        result = statestore(stream, "validate", "--json", *args)
        assert result.exit_code == 0, result.output
        checks = json.loads(result.output)["checks"]
        return next(c["figures"] for c in checks if c["name"] == CheckName.LINEAGE.value)

    assert figures("--verify-sample-percent", "0")["files"] == 9
    assert figures("--verify-sample-percent", "0")["files_present"] == FILES
    env = {"STATE_MAINTENANCE_VERIFY_SAMPLE_PERCENT": "0"}
    result = statestore(stream, "validate", "--json", "--full", env=env)
    assert result.exit_code == 0, result.output
    full = next(c for c in json.loads(result.output)["checks"] if c["name"] == "lineage_valid")
    assert (full["figures"]["files"], full["figures"]["files_present"]) == (FILES, 0)
    bad = statestore(stream, "validate", "--verify-sample-percent", "101")
    assert bad.exit_code == 2 and "101" in bad.output


def reads_of(stream: StoreStream, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the stream's storage reads from now on, as read (the storage layer's own
    calls, not a timing)."""
    read, paths = stream.storage.read, []

    def recording(path: str) -> bytes:
        paths.append(path)
        return read(path)

    monkeypatch.setattr(stream.storage, "read", recording)
    return paths


@pytest.mark.parametrize("batches", [1, 3])
def test_a_run_after_new_batches_reads_only_their_files(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch, batches: int
) -> None:
    """After ``batches`` new batches an incremental run (no sample) reads exactly the new
    deltas the retained versions load, each once; at the default rate it reads them and
    its sample, and its counts say which is which."""
    stream = built(make_stream)
    validated(stream, POLICY)
    read = reads_of(stream, monkeypatch)
    stream.run(batches)
    new = {f.path for s in stream.stores for f in stream.committed[s][8:]}
    report = validated(stream, INCREMENTAL)
    assert report.ok and sorted(read) == sorted(new)
    counts = report.validation.counts()
    assert (counts["files_new"], counts["files_sampled"], counts["files_rechecked"]) == (
        len(new),
        0,
        0,
    )
    run = stream.catalog.run(report.run_id)
    assert run is not None and run.counts["files_new"] == len(new)  # what the run read
    assert run.parameters["verify_sample_percent"] == 0
    read.clear()
    stream.run(batches)
    newer = {f.path for s in stream.stores for f in stream.committed[s][8 + batches :]}
    again = validated(stream, MaintenancePolicy()).validation.counts()  # the default rate
    assert set(read) >= newer and len(read) == len(set(read)) == again["files"]
    assert (again["files_new"], again["files_rechecked"]) == (len(newer), 0)
    assert again["files_sampled"] == len(read) - len(newer)


def test_the_default_rate_finds_an_in_place_bit_flip_within_its_runs_and_full_at_once(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A verified delta damaged in place (size kept): the listing cannot see it, the sample
    reads it within about 100 / p runs (p = the default 5 percent, so 20; each store holds
    4 verified files and reads one when its draw rounds 4 x 5% up, the longest unread
    first), and a full validation at once. Seeded: the same runs every time."""
    percent = MaintenancePolicy().verify_sample_percent
    assert percent == 5
    default = replace(POLICY, verify_sample_percent=percent)
    stream = built(make_stream)
    validated(stream, default)
    rotten = corrupt_in_place(stream)
    sampler = random.Random(35)
    runs = 0
    while runs < 2 * 100 // percent:
        runs += 1
        stream.storage.requests.reset()
        report = run_checks(fleet_on(stream), default, sampler=sampler)
        if not report.ok:
            break
    assert [f.path for f in report.validation.errors] == [rotten]
    assert 1 < runs <= 2 * 100 // percent, runs
    assert report.validation.counts()["files_sampled"] >= 1

    second = stream.committed[stream.stores[1]][6]  # another verified delta, damaged in place
    path = stream.storage.root / second.path
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    incremental = validated(stream, INCREMENTAL)  # the listing cannot see it
    assert [f.path for f in incremental.validation.errors] == [rotten]
    full = validated(stream, replace(POLICY, verify_sample_percent=100))
    assert {f.path for f in full.validation.errors} == {rotten, second.path}
    assert full.validation.counts()["files"] == FILES  # every file, at once


def test_damage_the_runtime_records_during_a_run_stays_open(
    make_stream: Callable[..., StoreStream],
) -> None:
    """The runtime records in-place damage on a store while a validation run is at an earlier
    store (here: when the run lists the first store's folder). The run read the problems when
    it started, so it does not read that file; it must leave the problem open for the next
    run, not close it as no longer found."""
    stream = built(make_stream)
    validated(stream, INCREMENTAL)
    storage = stream.storage
    order = [r.key for r in fleet_on(stream).stores(None)]  # the run's order (one worker)
    first, damaged = order[0], order[-1]
    rotten = corrupt_in_place(stream, damaged.store)

    class RuntimeMeanwhile:
        """The stream's storage; listing the first store's folder records the runtime's
        finding on the last store."""

        def __getattr__(self, name: str) -> object:
            return getattr(storage, name)

        def list(self, prefix: str) -> object:
            if prefix == first.store.directory:
                stream.catalog.add_problems(damaged, [FoundProblem("checksum mismatch", rotten)])
            return storage.list(prefix)

    fleet = Fleet(stream.catalog, open_storage=lambda root: RuntimeMeanwhile(), owner="tests")
    validate_stores(fleet, INCREMENTAL, workers=1)
    [problem] = stream.catalog.problems(store=damaged)
    assert problem.path == rotten  # still open
    again = validated(stream, INCREMENTAL)  # named by an open problem: read, and found
    assert [f.path for f in again.validation.errors] == [rotten]


def test_a_verified_snapshot_read_again_is_checked_as_stored_and_damage_still_found(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot verified before (decoded whole by the snapshot pass) whose payload hashes to
    its recorded checksum is not decoded again: a decoder that fails every file fails none of
    a full validation's verified files, while a snapshot not verified is still decoded (once:
    the deltas' format needs no decoding to be checked) and a byte flipped in a verified one
    (size kept) is still found."""
    stream = built(make_stream)
    assert validated(stream, INCREMENTAL).ok  # every file verified now
    fleet = fleet_on(stream)
    store = stream.stores[0]
    snapshot = next(
        f
        for f in fleet.catalog.store_files(stream.storage.uri, store)
        if f.kind is FileKind.SNAPSHOT
    )
    assert snapshot.verification == Verification.VERIFIED

    def undecodable(*_: object, **__: object) -> object:
        raise ValueError("rows decoded again")

    monkeypatch.setattr(checkpoint_format, "decode_table", undecodable)
    full = replace(POLICY, verify_sample_percent=100)
    assert validated(stream, full).ok
    data = (stream.storage.root / snapshot.path).read_bytes()
    assert verify_bytes(data, snapshot.expected()) == (
        "corrupt checkpoint file: unparsable content: rows decoded again"
    )
    monkeypatch.undo()

    with fleet.catalog.engine.begin() as connection:  # as if never verified
        connection.execute(
            sa.update(checkpoint_files)
            .where(checkpoint_files.c.path == snapshot.path)
            .values(verification=Verification.UNVERIFIED.value)
        )
    decoded: list[object] = []

    def counted(table: object, *args: object) -> object:
        decoded.append(table)
        return decode_table(table, *args)

    monkeypatch.setattr(checkpoint_format, "decode_table", counted)
    assert validated(stream, full).ok
    assert len(decoded) == 1
    monkeypatch.undo()

    path = stream.storage.root / snapshot.path
    flipped = bytearray(data)
    flipped[-10] ^= 0xFF
    path.write_bytes(bytes(flipped))
    report = validated(stream, full)
    assert [(f.path, f.problem) for f in report.validation.errors] == [
        (snapshot.path, "corrupt checkpoint file: checksum mismatch: the bytes were altered")
    ]
