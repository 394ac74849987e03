"""Batches that change nothing write no file: the version advances in the catalog with its
parent's checkpoint id, and loading, validation, snapshots, cleanup and the change feed all
handle a version without a file (SQLite and PostgreSQL catalogs; local storage)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from state_runtime.maintenance import (
    MaintenancePolicy,
    cleanup_pass,
    relocate_root,
    run_checks,
    snapshot_pass,
)
from state_runtime.runtime.state_reads import load_changes
from state_runtime.store.checkpoint_info import NO_FILE_CHECKSUM
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import assert_retained_versions_load, on_disk
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=3)
LATER = datetime.now(UTC) + timedelta(days=1)
IDLE = frozenset({2, 3, 6, 8, 9})  # batches 2 and 3 commit versions 3 and 4, ...


def _stream(make_stream: Callable[..., StoreStream], batches: int = 10) -> StoreStream:
    stream = make_stream(idle=IDLE)
    stream.run(batches)
    return stream


def test_an_idle_batch_writes_nothing_and_keeps_its_parents_id(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = _stream(make_stream)
    files = on_disk(stream)
    for store in stream.stores:
        chain = stream.committed[store]
        for batch, info in enumerate(chain):
            assert info.has_file is (batch not in IDLE)
            if batch in IDLE:
                assert info.checkpoint_id == chain[batch - 1].checkpoint_id
                assert (info.bytes_written, info.checksum) == (0, NO_FILE_CHECKSUM)
                assert info.path not in files
            else:
                assert info.path in files
        for version in range(1, len(chain) + 1):
            assert stream.loaded(store, version) == stream.expected(store, version)
    latest = stream.catalog.latest_committed(stream.root)
    assert {ref.version for ref in latest.values()} == {10}  # the versions still advance
    assert latest[stream.stores[0]] == stream.committed[stream.stores[0]][-1].ref


def test_checks_pass_and_validation_reads_no_missing_file(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = _stream(make_stream)
    stream.storage.requests.reset()
    report = run_checks(fleet_on(stream), POLICY)
    assert report.ok and all(o.passed for o in report.outcomes), report.outcomes
    assert report.validation.counts()["errors"] == 0


def test_snapshots_and_cleanup_keep_every_retained_version_loadable(
    make_stream: Callable[..., StoreStream],
) -> None:
    """The latest two versions (10 and 9) have no file: they load through version 8's
    parent chain, so cleanup keeps every delta; a snapshot of a version without a file is
    written under its name, and once the retained versions load from it, the deltas below
    it go (versions without a file have no record to delete)."""
    stream = _stream(make_stream)
    fleet = fleet_on(stream)
    snapshot_pass(fleet, POLICY)
    report = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    assert report.deleted == [] and not report.failed  # version 9 loads from deltas 1..8
    assert_retained_versions_load(stream)
    assert run_checks(fleet_on(stream), POLICY).ok
    stream.run(2)  # the stream goes on after maintenance: versions 11 and 12 load from 10
    report = cleanup_pass(fleet, POLICY, now=LATER, dry_run=False)
    below = {i.path for s in stream.stores for i in stream.committed[s][:8] if i.has_file}
    assert {v.file.path for v in report.deleted} == below and not report.failed
    assert_retained_versions_load(stream)
    assert run_checks(fleet_on(stream), POLICY).ok


def test_the_change_feed_of_an_idle_batch_is_empty(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = _stream(make_stream)
    store = stream.stores[0]
    history = stream.provider(store).history
    for batch in (1, 2, 4):
        info = stream.committed[store][batch]
        source = (batch, store.partition_id, info.version, info.checkpoint_id)
        rows = sum(
            b.num_rows
            for b in load_changes(
                stream.storage, store.operator_id, store.store_name, history, source
            )
        )
        assert (rows == 0) is (batch in IDLE)


def test_a_root_copied_elsewhere_relocates_without_the_files_that_never_were(
    make_stream: Callable[..., StoreStream], tmp_path: Path
) -> None:
    stream = _stream(make_stream)
    copy = tmp_path / "moved"
    shutil.copytree(stream.storage.root, copy)
    report = relocate_root(stream.catalog, stream.root, str(copy), dry_run=False)
    assert report.executed and report.missing == []
    idle_records = sum(1 for s in stream.stores for i in stream.committed[s] if not i.has_file)
    assert report.files_checked == sum(len(c) for c in stream.committed.values()) - idle_records
