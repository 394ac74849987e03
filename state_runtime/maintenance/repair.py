"""Repair: rebuild damaged snapshots from their intact deltas.

A repair targets each damaged snapshot (found by validation, the snapshot pass or the
runtime) that :func:`state_runtime.maintenance.damage.classify` calls *repairable*: its version
still loads from intact deltas below it. For each, under the store's lease:

1. load the snapshot's version through the catalog's inventory from the verified snapshot
   and the committed deltas below it (the damaged file is not offered to the loader), and
   build the new snapshot's bytes in memory with the provider's own writer;
2. verify those bytes (size, checksum, header naming the store, version and id, row count
   equal to the one the commit recorded);
3. record the repair in the catalog: the damaged bytes' size and SHA-256 as found (or that
   they were gone) and the record they had, before anything is removed;
4. delete the damaged file: files are written put-if-absent and a snapshot's name is
   ``<version>_<id>.snapshot``, so the new one cannot take the name while the damaged one
   holds it;
5. write the new file (put-if-absent), read it back and verify it;
6. record it: the file's record takes the new size and checksum and counts as verified, and
   the problems about it are resolved. Only now may it supersede deltas.

A crash anywhere loses nothing: until step 6 commits the snapshot is not verified in the
catalog, so every delta below it stays needed and every retained version loads (a loader that
finds the snapshot missing or damaged reads the deltas instead). A rerun resumes the recorded
repair: a missing file is written; a file holding exactly the rebuilt state (written before
the crash) is verified and adopted; anything else is still damaged and is replaced.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from state_runtime.catalog import (
    FileRecord,
    FileVerdict,
    FoundProblem,
    RunKind,
    StoreKey,
    Verdict,
)
from state_runtime.errors import (
    CannotLoadState,
    CatalogError,
    StateStoreError,
    StorageFileNotFound,
)
from state_runtime.maintenance.damage import Damage, DamageReport, Fate, damaged_files
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.leases import leased
from state_runtime.maintenance.listing import StagedWrites
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.retention import intact, loading_files
from state_runtime.store.checkpoint_format import checksum, decode
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_verification import expected_of, verify_bytes


class RepairStatus(StrEnum):
    REPAIRED = "repaired"  # rebuilt from the deltas, written, verified, recorded
    ADOPTED = "adopted"  # an interrupted repair had written the rebuilt file: verified, recorded
    INTACT = "intact"  # the file verifies against its record after all (restored by hand)
    UNREPAIRABLE = "unrepairable"  # the files below it do not load its version
    BUSY = "busy"  # another run holds the store's lease
    FAILED = "failed"


@dataclass(frozen=True)
class RepairOutcome:
    key: StoreKey
    path: str
    version: int
    status: RepairStatus
    detail: str
    seconds: float = 0.0


@dataclass(frozen=True)
class RepairReport:
    run_id: int
    outcomes: list[RepairOutcome]

    def count(self, status: RepairStatus) -> int:
        return sum(o.status is status for o in self.outcomes)

    @property
    def failed(self) -> list[RepairOutcome]:
        bad = (RepairStatus.FAILED, RepairStatus.UNREPAIRABLE)
        return [o for o in self.outcomes if o.status in bad]

    def summary(self) -> str:
        """The pass in one line: repaired, adopted, failed or unrepairable."""
        c = self.counts()
        return (
            f"repair (run {self.run_id}): {c['repaired']} repaired, {c['adopted']} adopted, "
            f"{c['intact']} intact, {c['unrepairable']} unrepairable, {c['busy']} busy, "
            f"{c['failed']} failed"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per snapshot looked at: its outcome and ``detail`` in words."""
        return [
            {
                "store": str(o.key),
                "path": o.path,
                "status": o.status.value,
                "detail": f"{o.status.value} {o.path} (version {o.version}): {o.detail}",
            }
            for o in self.outcomes
        ]

    def counts(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in RepairStatus}


@dataclass(frozen=True)
class RebuildPlan:
    """A repair's dry run: the damaged snapshots it would rebuild, each with its cause."""

    damaged: list[Damage]

    def summary(self) -> str:
        return f"repair (dry run): {len(self.damaged)} damaged snapshot(s) to rebuild"

    def rows(self) -> list[dict[str, Any]]:
        """One row per damaged snapshot: its file and ``detail``, the cause and the advice."""
        return [
            {"store": str(d.key), "path": d.file.path, "detail": d.paragraph(store=False)}
            for d in self.damaged
        ]

    def counts(self) -> dict[str, int]:
        return {"damaged_snapshots": len(self.damaged)}


def rebuild_plan(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None = None
) -> RebuildPlan:
    """What a repair's dry run shows: the snapshots :func:`repair_pass` would rebuild."""
    return RebuildPlan(damaged_files(fleet, policy, only).of(Fate.REPAIRABLE))


def damaged_snapshots(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None = None
) -> list[FileVerdict]:
    """The snapshots a repair rebuilds: the damaged files in scope that :func:`classify`
    calls repairable (a dry run promises exactly what an executed repair does)."""
    return [
        FileVerdict(d.file, Verdict.DAMAGED, d.paragraph(), None)
        for d in damaged_files(fleet, policy, only).of(Fate.REPAIRABLE)
    ]


def beyond_repair(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None = None
) -> DamageReport:
    """What repair does not fix in scope: the damaged files that are not repairable, each
    with its fate and next command, and the open problems that name no damaged file."""
    return damaged_files(fleet, policy, only).beyond_repair()


def repair_pass(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    progress: Progress = SILENT,
) -> RepairReport:
    """Rebuild every damaged snapshot in scope (see the module docstring); one recorded run
    (kind 'snapshot': a repair writes snapshots; its parameters say ``repair``)."""
    targets = damaged_snapshots(fleet, policy, only)
    parameters = policy.parameters() | {"repair": True, "snapshots": len(targets)}
    with (
        recorded_run(
            fleet.catalog, RunKind.SNAPSHOT, fleet.owner, parameters, policy.status_limits()
        ) as run,
        progress.stage("repairs", len(targets)) as advance,
    ):
        outcomes = []
        for target in targets:
            outcomes.append(_repair(fleet, policy, target.file, run.run_id))
            advance(1)
        report = RepairReport(run.run_id, outcomes)
        run.counts = report.counts()
    return report


def _repair(
    fleet: Fleet, policy: MaintenancePolicy, damaged: FileRecord, run_id: int
) -> RepairOutcome:
    key, catalog = damaged.key, fleet.catalog
    started = time.perf_counter()

    def outcome(status: RepairStatus, detail: str) -> RepairOutcome:
        return RepairOutcome(
            key, damaged.path, damaged.version, status, detail, time.perf_counter() - started
        )

    with leased(catalog, [key], fleet.owner, policy.lease_ttl, run_id) as held:
        if held.busy:
            return outcome(RepairStatus.BUSY, "another run holds the store's lease")
        try:
            return outcome(*_rebuild(fleet, damaged, run_id))
        except CatalogError:
            raise
        except StateStoreError as exc:
            failed = FoundProblem(f"repair by run {run_id} failed: {exc.reason}", damaged.path)
            catalog.add_problems(key, [failed], run_id=run_id)
            return outcome(RepairStatus.FAILED, str(exc))


def _rebuild(fleet: Fleet, damaged: FileRecord, run_id: int) -> tuple[RepairStatus, str]:
    key, catalog = damaged.key, fleet.catalog
    storage = fleet.storage(key.root)
    files = [f for f in catalog.store_files(key.root, key.store) if f.path != damaged.path]
    facts = [f.facts() for f in files]
    if not intact(facts, damaged.version, catalog.idle_versions(key.root, key.store)):
        return RepairStatus.UNREPAIRABLE, (
            f"version {damaged.version} has no intact path below its snapshot: its deltas "
            "are missing or damaged (restore them, then repair)"
        )
    chain = {f.path for f in loading_files(facts, damaged.version)}
    (record,) = fleet.stores([key])
    provider = fleet.provider(record, [f for f in files if f.path in chain], staged=True)
    staging = provider.storage
    assert isinstance(staging, StagedWrites)
    info = provider.snapshot(damaged.version, damaged.checkpoint_id)
    data = staging.staged[info.path]
    problem = verify_bytes(data, expected_of(info))
    # the newest file of the chain holds the version's row count (the versions above it, if
    # any, changed nothing)
    newest = max((f for f in files if f.path in chain), key=lambda f: f.version)
    if problem is None and info.rows != newest.rows:
        problem = f"the rebuilt state has {info.rows} rows, the commit recorded {newest.rows}"
    if problem is not None:
        return RepairStatus.FAILED, f"the rebuilt snapshot does not verify: {problem}"
    try:
        found: bytes | None = storage.read(damaged.path)
    except StorageFileNotFound:
        found = None
    if found is not None and verify_bytes(found, damaged.expected()) is None:
        catalog.record_verifications(key.root, {damaged.path: None})
        catalog.resolve_problems(
            key,
            f"verified intact by run {run_id}: the file matches its record again",
            run_id=run_id,
            path=damaged.path,
        )
        return RepairStatus.INTACT, "the file verifies against its record: nothing rebuilt"
    note = damaged.verification_note or "damaged"
    repair_id = catalog.begin_repair(run_id, key.root, damaged.path, note, found)
    if found is not None and _same_snapshot(found, data, info):
        adopted = _described(found, info)
        catalog.finish_repair(repair_id, key.root, adopted)
        return RepairStatus.ADOPTED, "found the rebuilt snapshot an interrupted repair wrote"
    if found is not None:
        storage.delete([damaged.path])
        catalog.repair_removed(repair_id)
    storage.write_if_absent(damaged.path, data)
    written = storage.read(damaged.path)
    problem = verify_bytes(written, expected_of(info))
    if problem is not None:
        raise CannotLoadState(
            f"the rebuilt snapshot failed verification after it was written: {problem}",
            store=key.store,
            version=damaged.version,
            path=damaged.path,
        )
    catalog.finish_repair(repair_id, key.root, info)
    return RepairStatus.REPAIRED, f"rebuilt from {len(chain)} file(s) and verified"


def _same_snapshot(found: bytes, rebuilt: bytes, info: CheckpointInfo) -> bool:
    """Whether ``found`` is a sound snapshot holding exactly the rebuilt state."""
    try:
        described = _described(found, info)
    except CannotLoadState:
        return False
    if verify_bytes(found, expected_of(described)) is not None:
        return False
    found_header, found_rows = decode(found, info.path)
    rebuilt_header, rebuilt_rows = decode(rebuilt, info.path)
    return found_header.lineage == rebuilt_header.lineage and found_rows.equals(rebuilt_rows)


def _described(data: bytes, info: CheckpointInfo) -> CheckpointInfo:
    """``info`` for the snapshot bytes ``data`` of the same version (their size, checksum and
    time)."""
    header, _ = decode(data, info.path)
    return CheckpointInfo(
        store=info.store,
        version=info.version,
        checkpoint_id=info.checkpoint_id,
        base_checkpoint_id=info.base_checkpoint_id,
        lineage=info.lineage,
        kind=info.kind,
        path=info.path,
        rows=header.state_rows,
        file_rows=header.file_rows,
        bytes_written=len(data),
        checksum=checksum(data),
        created_at=header.created_at,
    )
