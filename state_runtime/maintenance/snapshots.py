"""The snapshot pass: snapshot every store whose delta chain (or recovery cost) is too long.

Candidates come from the catalog (no listing). Each store is worked on under its catalog
lease, renewed while its chunk is worked on, so overlapping runs never snapshot the same store
at once; a store whose lease is held elsewhere is skipped and picked up by the next run. The
latest committed version is loaded through the catalog's inventory, written as
``<v>_<id>.snapshot`` (put-if-absent, idempotent), read back and verified (size, checksum,
header naming the store, version and id), and recorded in the catalog with that verification
in one transaction: only a verified snapshot replaces the deltas before it. A snapshot that
fails verification is recorded as damaged, opens a problem on the store, and waits for
``repair``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

from state_runtime.catalog import Catalog, RetainedVersion, RunKind, StoreKey, StoreRecord
from state_runtime.errors import (
    CannotLoadState,
    CatalogError,
    CheckpointFileCorrupt,
    MaintenanceRefused,
    StateStoreError,
)
from state_runtime.identity import FileKind
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.host_processes import spread_for
from state_runtime.maintenance.leases import leased
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.maintenance.spread import Spread
from state_runtime.maintenance.workers import closing_items, map_bounded, worker_count
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_verification import expected_of, verify_file
from state_runtime.store.schema_history import SchemaHistory
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


OUTCOMES_KEPT = 1000
"""A report keeps the first this many outcomes, and failures past them until it keeps this many
failures, in detail (and counts every one): its memory is bounded whatever the fleet."""


@dataclass
class SnapshotReport:
    """What a snapshot pass did, counted as each store is done: ``outcomes`` holds the first
    :data:`OUTCOMES_KEPT` outcomes in the pass's order, then the failures past them until it
    holds that many failures (each outcome once: ``--json`` prints ``run_id``, ``outcomes``
    and ``counts``, which count every store, kept or not)."""

    run_id: int
    outcomes: list[SnapshotOutcome] = field(default_factory=list)
    _statuses: dict[SnapshotStatus, int] = field(
        default_factory=lambda: dict.fromkeys(SnapshotStatus, 0), repr=False
    )
    _bytes_written: int = field(default=0, repr=False)
    _failures_kept: int = field(default=0, repr=False)

    def add(self, outcome: SnapshotOutcome) -> None:
        """Count one store's outcome in (and keep it, while there is room)."""
        self._statuses[outcome.status] += 1
        failed = outcome.status is SnapshotStatus.FAILED
        if outcome.status is SnapshotStatus.WRITTEN:
            self._bytes_written += outcome.bytes
        if len(self.outcomes) < OUTCOMES_KEPT or (failed and self._failures_kept < OUTCOMES_KEPT):
            self.outcomes.append(outcome)
            self._failures_kept += failed

    @property
    def failed(self) -> list[SnapshotOutcome]:
        """The failures kept (the first :data:`OUTCOMES_KEPT`)."""
        return [o for o in self.outcomes if o.status is SnapshotStatus.FAILED]

    def count(self, status: SnapshotStatus) -> int:
        return self._statuses[status]

    def summary(self) -> str:
        """The pass in one line, as every front end shows it."""
        c = self.counts()
        return (
            f"snapshots (run {self.run_id}): {c['written']} written ({size(c['bytes_written'])}), "
            f"{c['recorded']} recorded, {c['up_to_date']} up to date, {c['busy']} busy, "
            f"{c['failed']} failed"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per kept store (the first outcomes, then the kept failures past them):
        its outcome's figures and ``detail``, the outcome in words."""
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
        return {s.value: n for s, n in self._statuses.items()} | {
            "bytes_written": self._bytes_written
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
    """Snapshot every due store in scope, ``workers`` at once (:func:`worker_count`), in
    this process, this host's worker processes or, given a ``spread``, its workers (each
    slice ``workers`` at once; :func:`spread_for` decides); one
    recorded 'snapshot' run, its report counted as the stores are done."""
    candidates = due_for_snapshot(fleet, policy, only)
    parameters = policy.parameters() | {"stores": len(candidates)}
    with recorded_run(
        fleet.catalog, RunKind.SNAPSHOT, fleet.owner, parameters, policy.status_limits()
    ) as run:
        work = partial(snapshot_stores, policy, run.run_id, workers)
        on = spread_for(fleet, policy, spread, len(candidates), "snapshot", workers)
        done = work(fleet, candidates) if on is None else on.map(fleet, candidates, work)
        report = SnapshotReport(run.run_id)
        with progress.stage("snapshots", len(candidates)) as advance, closing_items(done) as items:
            for outcome in items:
                report.add(outcome)
                advance(1)
        run.counts = report.counts()
    return report


CHUNK_STORES = 20
"""Stores of one root a worker snapshots together: their leases taken in one transaction (and
renewed in one between stores, as the chunk may outlast them), their retained versions and
their root's schema histories read in one query each, and their snapshots recorded in one
transaction (a few catalog round trips for all, not five each)."""


def snapshot_stores(
    policy: MaintenancePolicy,
    run_id: int,
    workers: int | None,
    fleet: Fleet,
    candidates: Sequence[DueStore],
) -> Iterator[SnapshotOutcome]:
    """Snapshot ``candidates`` under run ``run_id``, ``workers`` at once: the whole pass on
    one host, or one slice of it in a spread's worker. The candidates are handed out in
    their order (by priority) as workers free up, in chunks of one root (:func:`_chunks`)."""
    count = worker_count(fleet.catalog, policy, workers)
    work = partial(_snapshot_chunk, fleet, policy, run_id)
    with closing_items(map_bounded(work, _chunks(candidates, count), count, "snapshots")) as done:
        for outcomes in done:
            yield from outcomes


def _chunks(candidates: Sequence[DueStore], workers: int) -> Iterator[list[DueStore]]:
    """``candidates`` a window of one chunk per worker at a time, in priority order; within
    a window (stores worked on at once anyway), each root's stores form a chunk of at most
    :data:`CHUNK_STORES`; a window that is not full is split a ``workers``-th each, so that
    it still spreads over the workers."""
    window = CHUNK_STORES * workers
    for start in range(0, len(candidates), window):
        page = candidates[start : start + window]
        size = max(1, min(CHUNK_STORES, -(-len(page) // workers)))
        by_root: dict[str, list[DueStore]] = {}
        for candidate in page:
            by_root.setdefault(candidate.record.key.root, []).append(candidate)
        for same_root in by_root.values():
            for first in range(0, len(same_root), size):
                yield same_root[first : first + size]


def _snapshot_chunk(
    fleet: Fleet, policy: MaintenancePolicy, run_id: int, chunk: Sequence[DueStore]
) -> list[SnapshotOutcome]:
    """Snapshot a chunk of stores of one root under their leases: one transaction takes the
    leases, one read each gets their retained versions and the root's schema histories, each
    snapshot is written and read back (the leases renewed before each store, when due), and
    one transaction records them all. A store whose lease ran out and passed to another run
    meanwhile is left to that run: BUSY if not started, FAILED (its snapshot not recorded)
    if written."""
    catalog, root = fleet.catalog, chunk[0].record.key.root
    keys = [c.record.key for c in chunk]
    with leased(catalog, keys, fleet.owner, policy.lease_ttl, run_id) as held:
        busy = set(held.busy)
        free = [c for c in chunk if c.record.key not in busy]
        retained = catalog.retained_versions_of(root, [c.record.key.store for c in free])
        histories = catalog.schema_histories(root) if free else {}
        outcomes = {c.record.key: _Snapshot(c) for c in chunk}
        written: list[_Snapshot] = []
        for candidate in chunk:
            done = outcomes[candidate.record.key]
            held.renew()
            if candidate.record.key in busy or candidate.record.key in held.lost:
                done.status, done.version = SnapshotStatus.BUSY, candidate.record.latest.version
                continue
            if done.write(fleet, retained.get(candidate.record.key.store, []), histories):
                written.append(done)
        held.renew()
        lost = set(held.lost)
        for done in written:
            if done.candidate.record.key in lost:
                done.lost()
        _record(
            catalog, root, [w for w in written if w.status is not SnapshotStatus.FAILED], run_id
        )
    return [outcomes[key].outcome() for key in keys]


def _record(catalog: Catalog, root: str, written: Sequence[_Snapshot], run_id: int) -> None:
    """Record a chunk's written snapshots in one transaction; a failure names the chunk's
    stores and the files written (the next pass finds and records them)."""
    recorded = [(w, w.info) for w in written if w.info is not None]
    if not recorded:
        return
    try:
        problems = catalog.record_verified_snapshots(
            root, [(info, w.problem) for w, info in recorded], run_id=run_id
        )
    except StateStoreError as exc:
        stores = ", ".join(str(info.store) for _, info in recorded)
        paths = ", ".join(info.path for _, info in recorded)
        raise exc.labelled(
            f"recording the snapshots of {len(recorded)} store(s) of {root} ({stores}) failed; "
            f"written and not recorded (the next snapshot pass records them): {paths}"
        ) from exc
    for (done, _), problem in zip(recorded, problems, strict=True):
        done.recorded(problem)


class _Snapshot:
    """One store's snapshot in a chunk: written and read back by :meth:`write`, then, once
    the chunk's transaction recorded it, settled by :meth:`recorded`."""

    def __init__(self, candidate: DueStore) -> None:
        self.candidate = candidate
        self.status = SnapshotStatus.UP_TO_DATE
        self.version = 0
        self.info: CheckpointInfo | None = None
        self.problem: str | None = None
        self.error: StateStoreError | None = None
        self.seconds = 0.0

    def write(
        self,
        fleet: Fleet,
        retained: Sequence[RetainedVersion],
        histories: Mapping[tuple[int, str], SchemaHistory],
    ) -> bool:
        """Write the snapshot of the latest retained version (unless it has one) and verify
        the file storage now holds; whether there is a snapshot to record."""
        started = time.perf_counter()
        try:
            if not retained:
                return False
            latest = retained[0]
            self.version = latest.ref.version
            first = latest.files[0] if latest.files else None
            if first is not None and first.kind is FileKind.SNAPSHOT and first.ref == latest.ref:
                return False
            store = self.candidate.record.key.store
            history = histories.get((store.operator_id, store.store_name))
            try:
                info = _write_snapshot(fleet, self.candidate.record, latest, history)
            except CatalogError:
                raise
            except StateStoreError as exc:
                self.status, self.error = SnapshotStatus.FAILED, exc
                return False
            self.status = SnapshotStatus.WRITTEN
            storage = fleet.storage(self.candidate.record.key.root)
            if not info.bytes_written:  # the file existed: record its real size
                self.status = SnapshotStatus.RECORDED
                info = dataclasses.replace(info, bytes_written=storage.size(info.path))
            self.info, self.version = info, info.version
            self.problem, _ = verify_file(storage, expected_of(info))
            return True
        finally:
            self.seconds = time.perf_counter() - started

    def lost(self) -> None:
        """The store's lease ran out while its snapshot was written, and another run took it
        (and may be changing the store): the snapshot is not recorded, and fails naming its
        file (the next pass finds it)."""
        if self.info is None:
            return
        self.status = SnapshotStatus.FAILED
        self.error = MaintenanceRefused(
            "the store's lease ran out while its snapshot was written and another run took "
            "it: the snapshot is not recorded (the next snapshot pass finds it)",
            store=self.info.store,
            version=self.info.version,
            path=self.info.path,
        )

    def recorded(self, problem: str | None) -> None:
        """What recording found: a snapshot that failed verification (read back, or its
        record says other bytes) supersedes nothing and fails, naming its file."""
        if problem is None or self.info is None:
            return
        self.status = SnapshotStatus.FAILED
        self.error = CheckpointFileCorrupt(
            f"the snapshot failed verification after it was written: {problem}; it "
            "supersedes nothing (`statestore repair` rebuilds it)",
            store=self.info.store,
            version=self.info.version,
            path=self.info.path,
        )

    def outcome(self) -> SnapshotOutcome:
        info, error = self.info, self.error
        return SnapshotOutcome(
            self.candidate.record.key,
            self.status,
            self.version,
            self.candidate.deltas_since_snapshot,
            path=error.path if error else info.path if info else None,
            bytes=info.bytes_written if info and self.status is not SnapshotStatus.FAILED else 0,
            seconds=self.seconds,
            error=None if error is None else str(error),
        )


def _write_snapshot(
    fleet: Fleet, record: StoreRecord, latest: RetainedVersion, history: SchemaHistory | None
) -> CheckpointInfo:
    """Load the latest version through the catalog's inventory and snapshot it; when the
    inventory does not lead to a loadable chain, retry once with a real listing."""
    ref = latest.ref
    if latest.complete:
        try:
            provider = fleet.provider(record, latest.files, history=history)
            return provider.snapshot(ref.version, ref.checkpoint_id)
        except CannotLoadState:
            pass
    provider = fleet.provider(record, latest.files, listed=True, history=history)
    return provider.snapshot(ref.version, ref.checkpoint_id)
