"""Store-level cleanup: which files of one store may go, and why; dry run unless asked.

This works from the files alone (one listing of the store's folder), given the latest
committed version, and applies the retention rule of :mod:`state_runtime.retention` (the
catalog applies the same rule to its inventory without listing). The facts come from the
files: the lineage recorded in each delta names the committed chain below ``latest``, and a
snapshot on that chain counts only once its bytes verify now (checksum, header naming this
store, version and id). Every file needed to load the last ``min_versions_to_retain``
committed versions is kept; no file younger than ``min_age`` is touched (it may belong to a
batch in flight); a store whose lineage cannot be traced is not cleaned at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from state_runtime.errors import CannotLoadState, InvalidArgument
from state_runtime.identity import EMPTY, CheckpointRef, FileKind, parse_file_name
from state_runtime.retention import (
    FileState,
    RetentionPolicy,
    StoreFile,
    Verification,
    judge_store,
)
from state_runtime.storage import FileInfo
from state_runtime.store.chain_files import unchanged
from state_runtime.store.provider import StateStoreProvider


@dataclass(frozen=True)
class Deletable:
    path: str
    size: int
    reason: str


@dataclass
class StoreCleanup:
    """One store's cleanup plan, and with ``dry_run=False`` what was done."""

    latest: CheckpointRef
    retained: list[CheckpointRef]
    needed: list[str]
    deletable: list[Deletable]
    dry_run: bool
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def reclaimable_bytes(self) -> int:
        return sum(d.size for d in self.deletable)


@dataclass
class _Lineage:
    """What tracing the committed chain found: each version's ref and verified snapshots."""

    chain: dict[int, CheckpointRef] = field(default_factory=dict)
    snapshots: dict[CheckpointRef, Verification] = field(default_factory=dict)


def _trace(
    provider: StateStoreProvider, ref: CheckpointRef, names: set[str], lineage: _Lineage
) -> None:
    """Walk down from ``ref`` to its newest sound snapshot (or version 0), noting each version
    and whether each snapshot on the way verifies. Raises CannotLoadState for a broken chain."""
    cur = ref
    while cur != EMPTY:
        lineage.chain[cur.version] = cur
        if f"{cur}.{FileKind.SNAPSHOT.value}" in names:
            try:
                provider.read_header(cur, FileKind.SNAPSHOT)
                lineage.snapshots[cur] = Verification.VERIFIED
                return
            except CannotLoadState:
                lineage.snapshots[cur] = Verification.FAILED  # its deltas are still needed
        if f"{cur}.{FileKind.DELTA.value}" not in names and unchanged(cur, names):
            cur = CheckpointRef(cur.version - 1, cur.checkpoint_id)  # changed nothing: no file
            continue
        header = provider.read_header(cur, FileKind.DELTA)
        cur = header.lineage[0] if header.lineage else EMPTY


def _parent(provider: StateStoreProvider, ref: CheckpointRef, names: set[str]) -> CheckpointRef:
    """The version ``ref`` builds on (its delta's lineage; the one below with the same id for
    a version that changed nothing and has no file)."""
    if f"{ref}.{FileKind.DELTA.value}" not in names and unchanged(ref, names):
        return CheckpointRef(ref.version - 1, ref.checkpoint_id)
    kind = FileKind.DELTA if f"{ref}.delta" in names else FileKind.SNAPSHOT
    lineage = provider.read_header(ref, kind).lineage
    return lineage[0] if lineage else EMPTY


def _facts(info: FileInfo, latest: CheckpointRef, lineage: _Lineage) -> StoreFile | None:
    """The rule's facts about a listed file; None for names that are not checkpoint files."""
    parsed = parse_file_name(info.path.rsplit("/", 1)[-1])
    if parsed is None:
        return None  # not ours: never delete what we do not understand
    oldest = min(lineage.chain, default=latest.version + 1)
    state, why = FileState.COMMITTED, None
    if parsed.version > latest.version:
        state = FileState.WRITTEN  # a batch after the latest commit: maybe in flight
    elif parsed.version >= oldest and lineage.chain.get(parsed.version) != parsed.ref:
        state, why = FileState.ORPHAN, f"not on the committed lineage of {latest}"
    verified = Verification.UNVERIFIED
    if parsed.kind is FileKind.SNAPSHOT:
        verified = lineage.snapshots.get(parsed.ref, Verification.UNVERIFIED)
    return StoreFile(
        path=info.path,
        kind=parsed.kind,
        version=parsed.version,
        state=state,
        # No catalog here, so no recorded time and no database clock: the age is the storage's
        # modification time against this host's clock, as it always was for this cleanup.
        created_at=info.modified,
        verification=verified,
        size=info.size,
        state_reason=why,
    )


def cleanup(
    provider: StateStoreProvider,
    latest: CheckpointRef,
    *,
    min_age: timedelta,
    dry_run: bool = True,
    now: datetime | None = None,
) -> StoreCleanup:
    """Plan (and unless ``dry_run``, perform) the cleanup of one store.

    ``latest`` is the newest committed version (from the commit log). Raises a
    CannotLoadState error, deleting nothing, if a retained version cannot be traced.
    """
    if min_age < timedelta(0):
        raise InvalidArgument(f"min_age {min_age} must not be negative")
    policy = RetentionPolicy(
        retain_versions=provider.config.min_versions_to_retain, window=min_age, orphan_grace=min_age
    )
    now = now or datetime.now(UTC)
    listing = list(provider.storage.list(provider.store_id.directory))
    names = {f.path.rsplit("/", 1)[-1] for f in listing}
    retained: list[CheckpointRef] = []
    cur = latest
    while cur != EMPTY and len(retained) < policy.retain_versions:
        retained.append(cur)
        cur = _parent(provider, cur, names)
    lineage = _Lineage()
    for ref in retained:
        _trace(provider, ref, names, lineage)
    files = [facts for info in listing if (facts := _facts(info, latest, lineage)) is not None]
    judged = judge_store(files, latest.version, policy, now)
    needed = sorted(j.file.path for j in judged if j.needed_by is not None)
    deletable = [
        Deletable(j.file.path, j.file.size, j.reason) for j in judged if j.verdict.deletable
    ]
    report = StoreCleanup(latest, retained, needed, deletable, dry_run)
    if not dry_run and deletable:
        result = provider.storage.delete([d.path for d in deletable])
        report.deleted, report.failed = result.deleted, result.failed
    return report
