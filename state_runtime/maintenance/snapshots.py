"""The snapshot pass: snapshot every store whose delta chain (or recovery cost) is too long.

Candidates come from the catalog (no listing). Each store is worked on under its catalog
lease, so overlapping runs never snapshot the same store at once; a store whose lease is
held elsewhere is skipped and picked up by the next run. The latest committed version is
loaded through the catalog's inventory, written as ``<v>_<id>.snapshot`` (put-if-absent,
idempotent), read back and verified (size, checksum, header naming the store, version and id),
and recorded in the catalog with that verification in one transaction: only a verified
snapshot replaces the deltas before it. A snapshot that fails verification is recorded as
damaged, opens a problem on the store, and waits for ``repair``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

from state_runtime.catalog import RetainedVersion, RunKind, StoreKey, StoreRecord
from state_runtime.errors import (
    CannotLoadState,
    CatalogError,
    CheckpointFileCorrupt,
    StateStoreError,
)
from state_runtime.identity import FileKind
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.leases import leased
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.maintenance.spread import Spread
from state_runtime.maintenance.workers import worker_count
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_verification import Expected, verify_file
from state_runtime.units import size


class SnapshotStatus(StrEnum):
    WRITTEN = "written"  # a new snapshot file, recorded
    RECORDED = "recorded"  # the file existed (an earlier run crashed); now recorded
    UP_TO_DATE = "up_to_date"  # the latest version already has a snapshot
    BUSY = "busy"  # another run holds the store's lease
    FAILED = "failed"


@dataclass(frozen=True)
class SnapshotOutcome:
    key: StoreKey
    status: SnapshotStatus
    version: int
    deltas_since_snapshot: int
    path: str | None = None
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class SnapshotReport:
    run_id: int
    outcomes: list[SnapshotOutcome]

    def count(self, status: SnapshotStatus) -> int:
        return sum(o.status is status for o in self.outcomes)

    @property
    def bytes_written(self) -> int:
        return sum(o.bytes for o in self.outcomes if o.status is SnapshotStatus.WRITTEN)

    @property
    def failed(self) -> list[SnapshotOutcome]:
        return [o for o in self.outcomes if o.status is SnapshotStatus.FAILED]

    def summary(self) -> str:
        """The pass in one line, as every front end shows it."""
        c = self.counts()
        return (
            f"snapshots (run {self.run_id}): {c['written']} written ({size(c['bytes_written'])}), "
            f"{c['recorded']} recorded, {c['up_to_date']} up to date, {c['busy']} busy, "
            f"{c['failed']} failed"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per store: its outcome's figures and ``detail``, the outcome in words."""
        return [
            {
                "store": str(o.key),
                "status": o.status.value,
                "version": o.version,
                "deltas_before": o.deltas_since_snapshot,
                "bytes": o.bytes,
                "detail": f"{o.status.value} at version {o.version} "
                f"({o.deltas_since_snapshot} deltas since the last snapshot"
                + (f", {size(o.bytes)}" if o.bytes else "")
                + ")"
                + (f": {o.error}" if o.error else ""),
            }
            for o in self.outcomes
        ]

    def counts(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in SnapshotStatus} | {
            "bytes_written": self.bytes_written
        }


@dataclass(frozen=True)
class DueStore:
    """A store due for a snapshot and the length of its delta chain."""

    record: StoreRecord
    deltas_since_snapshot: int
    recovery_bytes: int = 0
    """What a cold load of its latest version reads: the pass's priority."""


def due_for_snapshot(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None = None
) -> list[DueStore]:
    """Stores due for a snapshot by priority: the costliest cold load first (recovery bytes,
    then the longest chain), at most ``snapshots_per_run`` of them (from the catalog alone).

    The catalog is read a page of stores at a time; what is held is the stores due (with
    ``snapshots_per_run``, at most twice that: the best are kept as the pages go), never the
    fleet."""
    wanted = key_set(only)
    max_bytes = policy.snapshot_max_recovery_bytes
    threshold = policy.snapshot_min_deltas if max_bytes is None else 1
    limit = policy.snapshots_per_run
    found: list[DueStore] = []
    for root in fleet.query_roots(wanted):
        for page in fleet.catalog.snapshot_candidate_pages(threshold, root=root):
            for record, chain, cost in page:
                too_long = chain.deltas_since_snapshot >= policy.snapshot_min_deltas
                costly = max_bytes is not None and cost.bytes >= max_bytes
                if fleet.in_scope(record.key, wanted) and (too_long or costly):
                    found.append(DueStore(record, chain.deltas_since_snapshot, cost.bytes))
            if limit is not None and len(found) > 2 * limit:
                found = _by_priority(found)[:limit]
    return _by_priority(found)[:limit]


def _by_priority(due: list[DueStore]) -> list[DueStore]:
    return sorted(
        due, key=lambda c: (-c.recovery_bytes, -c.deltas_since_snapshot, str(c.record.key))
    )


def snapshot_pass(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    progress: Progress = SILENT,
    workers: int | None = None,
    spread: Spread | None = None,
) -> SnapshotReport:
    """Snapshot every due store in scope, ``workers`` at once (:func:`worker_count`), on
    this host or, given a ``spread``, in its workers (each slice ``workers`` at once); one
    recorded 'snapshot' run."""
    candidates = due_for_snapshot(fleet, policy, only)
    parameters = policy.parameters() | {"stores": len(candidates)}
    with recorded_run(
        fleet.catalog, RunKind.SNAPSHOT, fleet.owner, parameters, policy.status_limits()
    ) as run:
        work = partial(snapshot_stores, policy, run.run_id, workers)
        done = work(fleet, candidates) if spread is None else spread.map(fleet, candidates, work)
        outcomes: list[SnapshotOutcome] = []
        with progress.stage("snapshots", len(candidates)) as advance:
            for outcome in done:
                outcomes.append(outcome)
                advance(1)
        report = SnapshotReport(run.run_id, outcomes)
        run.counts = report.counts()
    return report


def snapshot_stores(
    policy: MaintenancePolicy,
    run_id: int,
    workers: int | None,
    fleet: Fleet,
    candidates: Sequence[DueStore],
) -> Iterator[SnapshotOutcome]:
    """Snapshot ``candidates`` under run ``run_id``, ``workers`` at once: the whole pass on
    one host, or one slice of it in a spread's worker."""
    with ThreadPoolExecutor(worker_count(fleet.catalog, policy, workers)) as pool:
        yield from pool.map(lambda c: _snapshot_store(fleet, policy, c, run_id), candidates)


def _snapshot_store(
    fleet: Fleet, policy: MaintenancePolicy, candidate: DueStore, run_id: int
) -> SnapshotOutcome:
    key, catalog = candidate.record.key, fleet.catalog
    started = time.perf_counter()

    def outcome(
        status: SnapshotStatus,
        version: int,
        info: CheckpointInfo | None = None,
        error: StateStoreError | None = None,
    ) -> SnapshotOutcome:
        return SnapshotOutcome(
            key,
            status,
            version,
            candidate.deltas_since_snapshot,
            path=info.path if info else error.path if error else None,
            bytes=info.bytes_written if info else 0,
            seconds=time.perf_counter() - started,
            error=None if error is None else str(error),
        )

    with leased(catalog, [key], fleet.owner, policy.lease_ttl, run_id) as held:
        if held.busy:
            return outcome(SnapshotStatus.BUSY, candidate.record.latest.version)
        retained = catalog.retained_versions(key.root, key.store)
        if not retained:
            return outcome(SnapshotStatus.UP_TO_DATE, 0)
        latest = retained[0]
        first = latest.files[0] if latest.files else None
        if first is not None and first.kind is FileKind.SNAPSHOT and first.ref == latest.ref:
            return outcome(SnapshotStatus.UP_TO_DATE, latest.ref.version)
        try:
            info = _write_snapshot(fleet, candidate.record, latest)
        except CatalogError:
            raise
        except StateStoreError as exc:
            return outcome(SnapshotStatus.FAILED, latest.ref.version, error=exc)
        status = SnapshotStatus.WRITTEN
        storage = fleet.storage(key.root)
        if not info.bytes_written:  # the file existed: record its real size
            status = SnapshotStatus.RECORDED
            info = dataclasses.replace(info, bytes_written=storage.size(info.path))
        found, _ = verify_file(storage, expected_of(info))
        problem = catalog.record_snapshot(
            key.root, info, run_id=run_id, verified=found is None, problem=found
        )
        if problem is not None:
            damaged = CheckpointFileCorrupt(
                f"the snapshot failed verification after it was written: {problem}; it "
                "supersedes nothing (`statestore repair` rebuilds it)",
                store=key.store,
                version=info.version,
                path=info.path,
            )
            return outcome(SnapshotStatus.FAILED, info.version, error=damaged)
        return outcome(status, info.version, info)


def expected_of(info: CheckpointInfo) -> Expected:
    """What a file just written (or found) must be: its identity, size and checksum."""
    return Expected(
        store=info.store,
        ref=info.ref,
        kind=info.kind,
        path=info.path,
        size=info.bytes_written,
        checksum=info.checksum,
        base_checkpoint_id=info.base_checkpoint_id,
    )


def _write_snapshot(fleet: Fleet, record: StoreRecord, latest: RetainedVersion) -> CheckpointInfo:
    """Load the latest version through the catalog's inventory and snapshot it; when the
    inventory does not lead to a loadable chain, retry once with a real listing."""
    ref = latest.ref
    if latest.complete:
        try:
            return fleet.provider(record, latest.files).snapshot(ref.version, ref.checkpoint_id)
        except CannotLoadState:
            pass
    provider = fleet.provider(record, latest.files, listed=True)
    return provider.snapshot(ref.version, ref.checkpoint_id)
