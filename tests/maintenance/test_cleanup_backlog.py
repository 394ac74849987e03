"""A store's cleanup backlog far larger than a claim is deleted in bounded claims."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import pytest

from state_runtime.catalog import Catalog, FileVerdict
from state_runtime.identity import StoreId
from state_runtime.maintenance import cleanup_pass
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import (
    LATER,
    POLICY,
    assert_retained_versions_load,
    on_disk,
    snapshotted,
)
from tests.maintenance.test_snapshots import fleet_on

CHUNK = 40
ORPHANS = 400


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"], indirect=True)
def test_a_store_with_many_more_files_than_a_claim_is_deleted_in_bounded_claims(
    make_stream: Callable[..., StoreStream], catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One store with 10 claims' worth of orphans (and its own deltas superseded by a
    snapshot) beside a store with a few: every claim holds at most ``CHUNK`` files, every
    deletable file goes, and nothing a retained version needs does."""
    big, small = StoreId(0, 0), StoreId(0, 1)
    stream = snapshotted(make_stream(stores=[big, small]))
    orphans = {info.path for info in stream.abandoned_attempts(big, ORPHANS)}
    plan = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    assert plan.planned_files > ORPHANS
    claims: list[int] = []
    claim = catalog.claim_deletions

    def counted(*args: Any, **kw: Any) -> list[FileVerdict]:
        found = claim(*args, **kw)
        claims.append(len(found))
        return found

    monkeypatch.setattr(catalog, "claim_deletions", counted)
    before = on_disk(stream)
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False, chunk_files=CHUNK)
    assert report.deleted_files == plan.planned_files and not report.failed
    assert max(claims) == CHUNK and len(claims) >= ORPHANS // CHUNK
    gone = before - on_disk(stream)
    assert orphans <= gone and len(gone) == plan.planned_files
    assert len(stream.catalog.deletion_history(root=stream.root, limit=10_000)) == (
        plan.planned_files
    )
    assert_retained_versions_load(stream)
    again = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    assert again.planned_files == 0


def _undeletable(stream: StoreStream, paths: Collection[str]) -> None:
    """Make each file at ``paths`` one storage refuses to delete, for real: a folder with a
    file in it where the file was (unlinking it fails, even for root)."""
    for path in paths:
        at = stream.storage.root / path
        at.unlink()
        at.mkdir()
        (at / "kept").write_bytes(b"")


def test_files_storage_refuses_to_delete_never_stop_a_store_cleanup(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A claim's worth of files an earlier run claimed that storage refuses to delete, and a
    few the run itself claims that it refuses too: each run tries each of them once (and
    counts it failed once), while every other deletable file goes in the same run."""
    big, small = StoreId(0, 0), StoreId(0, 1)
    stream = snapshotted(make_stream(stores=[big, small]))
    stream.abandoned_attempts(big, ORPHANS)
    catalog = stream.catalog
    crashed = catalog.start_run("cleanup", "crashed-run")
    stuck = {
        v.file.path
        for v in catalog.claim_deletions(
            crashed, POLICY.retention, stream.root, [big], limit=CHUNK, now=LATER
        )
    }
    later = catalog.deletable_files(POLICY.retention, root=stream.root, store=big, now=LATER)
    stuck_too = {v.file.path for v in later[CHUNK : CHUNK + 3]}  # claimed by the run itself
    _undeletable(stream, stuck | stuck_too)
    plan = cleanup_pass(fleet_on(stream), POLICY, now=LATER)
    assert len(stuck) == CHUNK and plan.planned_files > 2 * CHUNK
    before = on_disk(stream)
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False, chunk_files=CHUNK)
    assert report.failed_files == len(stuck | stuck_too)
    assert set(report.failed) == stuck | stuck_too
    assert report.deleted_files == plan.planned_files + len(stuck) - len(stuck | stuck_too)
    assert len(before - on_disk(stream)) == report.deleted_files
    assert cleanup_pass(fleet_on(stream), POLICY, now=LATER).planned_files == 0
    again = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False, chunk_files=CHUNK)
    assert (again.failed_files, again.deleted_files) == (len(stuck | stuck_too), 0)
    assert_retained_versions_load(stream)
