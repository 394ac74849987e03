"""A store's claims: paged by keyset, and under leases the claim loop keeps alive."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest

from state_runtime.catalog import Catalog, FileVerdict
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, cleanup_pass
from state_runtime.storage import LocalStorage
from state_runtime.storage.base import DeleteResult
from tests.maintenance.lease_clock import LeaseClock
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import (
    LATER,
    POLICY,
    assert_retained_versions_load,
    on_disk,
    snapshotted,
)
from tests.maintenance.test_snapshots import fleet_on

BIG, SMALL = StoreId(0, 0), StoreId(0, 1)


def _spread_backlog(stream: StoreStream, versions: int = 6, per_version: int = 5) -> None:
    """Orphans of ``BIG`` at ``versions`` successive versions (``per_version`` each): a
    backlog spread over versions, so that claims of a few files page through them."""
    for _ in range(versions):
        stream.abandoned_attempts(BIG, per_version)
        stream.run(1)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"], indirect=True)
def test_claims_page_by_keyset_and_delete_exactly_the_unpaged_plan(
    make_stream: Callable[..., StoreStream], catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims of 3 files through a backlog over many versions: each claim after the first
    starts from the version the one before ended at (the live index's range from there, not
    the store's whole verdict query again), and together they delete exactly the files
    the unpaged plan names, nothing a retained version needs."""
    stream = snapshotted(make_stream(stores=[BIG, SMALL]))
    _spread_backlog(stream)
    plan = {v.file.path for v in catalog.deletable_files(POLICY.retention, now=LATER)}
    assert len(plan) > 30
    starts: dict[tuple[StoreId, ...], list[int | None]] = {}  # each chunk's claims
    claim = catalog.claim_deletions

    def spied(*args: Any, **kw: Any) -> list[FileVerdict]:
        starts.setdefault(tuple(args[3]), []).append(kw.get("from_version"))
        return claim(*args, **kw)

    monkeypatch.setattr(catalog, "claim_deletions", spied)
    before = on_disk(stream)
    report = cleanup_pass(fleet_on(stream), POLICY, now=LATER, dry_run=False, chunk_files=3)
    assert before - on_disk(stream) == plan
    assert report.deleted_files == len(plan) and not report.failed
    big = starts[(BIG,)]
    assert len(big) > 10 and big[0] is None
    keyed = [start for start in big[1:] if start is not None]
    assert len(keyed) == len(big) - 1 and keyed == sorted(keyed) and keyed[-1] > keyed[0]
    assert_retained_versions_load(stream)
    assert cleanup_pass(fleet_on(stream), POLICY, now=LATER).planned_files == 0


class SlowDeletes(LocalStorage):
    """The stream's files, each delete taking ``step`` seconds of ``clock`` (a slow object
    store, without wall-clock margins)."""

    def __init__(self, stream: StoreStream, step: float) -> None:
        super().__init__(stream.storage.root)
        self.step, self.clock = step, LeaseClock()

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        self.clock.step(self.step)
        return super().delete(paths)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("many", ["claims", "batches"])
def test_a_chunk_longer_than_the_lease_ttl_keeps_its_leases(
    make_stream: Callable[..., StoreStream],
    catalog: Catalog,
    monkeypatch: pytest.MonkeyPatch,
    many: str,
) -> None:
    """A store deleted in about 8 claims (or in one claim of about 8 delete batches), each
    delete taking two fifths of the lease's time to live, takes more than twice that time to
    live: the leases are renewed between (and within) claims, so no delete ends after its
    leases could have run out, and every lease goes back at the end."""
    stream = snapshotted(make_stream(stores=[BIG]))
    _spread_backlog(stream)
    ttl = timedelta(minutes=1)
    slow = SlowDeletes(stream, 0.4 * ttl.total_seconds())
    fleet = Fleet(catalog, open_storage=lambda root: slow, owner="tests")
    plan = cleanup_pass(fleet, POLICY, now=LATER).planned_files
    slow.clock.spy(catalog, monkeypatch)
    report = cleanup_pass(
        fleet,
        dataclasses.replace(POLICY, lease_ttl=ttl),
        now=LATER,
        dry_run=False,
        chunk_files=plan // 8 + 1 if many == "claims" else plan + 1,
        delete_batch=plan // 8 + 1 if many == "batches" else plan + 1,
        workers=1,
    )
    assert slow.clock.stepped > 2 * ttl.total_seconds()  # outlasted the leases
    assert slow.clock.renewals >= 2 and slow.clock.longest < ttl.total_seconds()
    assert report.deleted_files == plan and not report.busy
    for key in (stream.key(store) for store in stream.stores):
        lease = catalog.try_acquire_lease(key, "after", timedelta(minutes=1))
        assert lease is not None
        catalog.release_lease(lease)
