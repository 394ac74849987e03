"""A store's cleanup backlog far larger than a claim is deleted in bounded claims."""

from __future__ import annotations

from collections.abc import Callable
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
