"""Store-level cleanup: which files of one store may go, and why; dry run unless asked.

This works from the files alone (one listing of the store's folder), given the latest
committed version. The catalog offers the same answers from its inventory without listing.
Rules: every file needed to load the last ``min_versions_to_retain`` committed versions is
kept; no file younger than ``min_age`` is touched (it may belong to a batch in flight); a
store whose lineage cannot be traced is not cleaned at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from state_runtime.errors import CannotLoadState, InvalidArgument
from state_runtime.identity import EMPTY, CheckpointRef, FileKind, parse_file_name
from state_runtime.provider import StateStoreProvider


@dataclass(frozen=True)
class Deletable:
    path: str
    size: int
    reason: str


@dataclass
class CleanupReport:
    """The plan, and with ``dry_run=False`` what was done."""

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


def _trace(
    provider: StateStoreProvider, ref: CheckpointRef, names: set[str]
) -> tuple[list[str], list[CheckpointRef]]:
    """Files needed to load ``ref`` and the versions passed on the way, newest first."""
    needed: list[str] = []
    chain: list[CheckpointRef] = []
    cur = ref
    while cur != EMPTY:
        chain.append(cur)
        snap = f"{cur}.{FileKind.SNAPSHOT.value}"
        if snap in names:
            try:
                provider.read_header(cur, FileKind.SNAPSHOT)
                needed.append(f"{provider.store_id.directory}/{snap}")
                break
            except CannotLoadState:
                pass  # unusable snapshot: its deltas are still needed
        header = provider.read_header(cur, FileKind.DELTA)
        needed.append(f"{provider.store_id.directory}/{cur}.{FileKind.DELTA.value}")
        cur = header.lineage[0] if header.lineage else EMPTY
    return needed, chain


def _parent(provider: StateStoreProvider, ref: CheckpointRef, names: set[str]) -> CheckpointRef:
    kind = FileKind.DELTA if f"{ref}.delta" in names else FileKind.SNAPSHOT
    lineage = provider.read_header(ref, kind).lineage
    return lineage[0] if lineage else EMPTY


def cleanup(
    provider: StateStoreProvider,
    latest: CheckpointRef,
    *,
    min_age: timedelta,
    dry_run: bool = True,
    now: datetime | None = None,
) -> CleanupReport:
    """Plan (and unless ``dry_run``, perform) the cleanup of one store.

    ``latest`` is the newest committed version (from the commit log). Raises a
    CannotLoadState error, deleting nothing, if a retained version cannot be traced.
    """
    if min_age < timedelta(0):
        raise InvalidArgument(f"min_age {min_age} must not be negative")
    now = now or datetime.now(UTC)
    listing = list(provider.storage.list(provider.store_id.directory))
    names = {f.path.rsplit("/", 1)[-1] for f in listing}
    retained: list[CheckpointRef] = []
    cur = latest
    while cur != EMPTY and len(retained) < provider.config.min_versions_to_retain:
        retained.append(cur)
        cur = _parent(provider, cur, names)
    needed: set[str] = set()
    on_lineage: set[CheckpointRef] = set()
    for ref in retained:
        files, chain = _trace(provider, ref, names)
        needed.update(files)
        on_lineage.update(chain)
    oldest = min((r.version for r in retained), default=0)
    deletable: list[Deletable] = []
    for info in listing:
        name = info.path.rsplit("/", 1)[-1]
        if info.path in needed or now - info.modified < min_age:
            continue
        parsed = parse_file_name(name)
        if parsed is None:
            continue  # not ours: never delete what we do not understand
        if parsed.ref in on_lineage:
            reason = f"not needed: version {parsed.version} loads from a newer snapshot"
        elif parsed.version < oldest:
            reason = f"older than the retained versions (oldest retained: {oldest})"
        else:
            reason = f"orphan: not on the committed lineage of {latest}"
        deletable.append(Deletable(info.path, info.size, reason))
    report = CleanupReport(latest, retained, sorted(needed), deletable, dry_run)
    if not dry_run and deletable:
        result = provider.storage.delete([d.path for d in deletable])
        report.deleted, report.failed = result.deleted, result.failed
    return report
