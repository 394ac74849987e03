"""Writes a killed writer never finished: temporary files (local) and multipart uploads (S3).

A writer killed between creating its temporary file (or starting its multipart upload) and
linking it (completing it) leaves bytes that no listing shows and no catalog records.
Cleanup finds them in the folders of the stores in scope, reconciliation below ``state/`` of
each root, and both remove those older than the grace for never-committed files: the
retention's uncommitted cutoff, ``max(window, orphan_grace)`` (a younger one may be a write
still running). Neither lists a checkpoint file for it: the local storage scans the folders
for temporary files, S3 lists the bucket's incomplete uploads (one request per 1,000).

A sweep never touches a write a live writer may still own, whatever the settings (window
and grace may both be 0, and the sweep runs without the store's lease): a local writer
holds a lock on its temporary file until it is linked (:class:`LocalStorage`), and the sweep
removes one only while holding that lock, so a locked one is left alone at any age (and a
writer whose new file was swept before it could lock it starts over with another). No
unfinished write younger than :data:`MIN_PARTIAL_WRITE_AGE` is removed: that floor, not a
setting, covers S3, whose uploads carry no liveness.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from state_runtime.catalog import StoreKey
from state_runtime.errors import StorageError
from state_runtime.maintenance.fleet import Fleet
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import PartialWrite

Folders = tuple[str, Sequence[str]]
"""A root and folders below it to sweep."""
MIN_PARTIAL_WRITE_AGE = timedelta(hours=1)
"""No unfinished write younger than this is removed, whatever the retention settings."""


def partial_write_cutoff(retention: RetentionPolicy, now: datetime) -> datetime:
    """Unfinished writes started before this may be removed (unless a live writer holds
    them): the retention's grace for never-committed files, at least the floor."""
    return min(retention.uncommitted_cutoff(now), now - MIN_PARTIAL_WRITE_AGE)


@dataclass
class LeftoverReport:
    """Unfinished writes found, removed (or that would be, in a dry run), and left alone."""

    found: list[PartialWrite] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    young: list[str] = field(default_factory=list)
    """Left alone: started after the cutoff, or held by a live writer."""
    failed: dict[str, str] = field(default_factory=dict)
    dry_run: bool = True
    """Whether ``removed`` names what would go rather than what went."""

    def counts(self) -> dict[str, int]:
        return {
            "leftovers_found": len(self.found),
            "leftovers_removed": len(self.removed),
            "leftovers_young": len(self.young),
            "leftovers_failed": len(self.failed),
        }

    def summary(self) -> str:
        """The sweep in one line: found, removed (or would be), left alone and failed."""
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"unfinished writes (temporary files, incomplete uploads): {len(self.found)} found, "
            f"{verb} {len(self.removed)}, {len(self.young)} too young (maybe still running), "
            f"{len(self.failed)} failed"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per unfinished write removed (or that would be) or that failed: its
        ``path``, ``outcome`` and ``detail`` in words."""
        verb = "would remove" if self.dry_run else "removed"
        removed = [{"path": p, "outcome": verb, "detail": f"{verb} {p}"} for p in self.removed]
        failed = [
            {"path": p, "outcome": f"failed: {why}", "detail": f"failed {p}: {why}"}
            for p, why in self.failed.items()
        ]
        return removed + failed


def store_folders(fleet: Fleet, only: Set[StoreKey] | None = None) -> Iterator[Folders]:
    """The folders of the stores in scope, a page of stores of one root at a time (never the
    fleet's at once)."""
    for page in fleet.store_pages(only):
        by_root: dict[str, list[str]] = {}
        for record in page:
            by_root.setdefault(record.key.root, []).append(record.key.store.directory)
        yield from by_root.items()


def sweep_leftovers(
    fleet: Fleet,
    folders: Iterable[Folders],
    older_than: datetime,
    *,
    dry_run: bool,
) -> LeftoverReport:
    """Find the unfinished writes below ``folders`` ((root, folders relative to it), as
    :func:`store_folders` pages them); with ``dry_run`` false remove those started before
    ``older_than`` (:func:`partial_write_cutoff`) that no live writer holds (a dry run
    reports them in ``removed`` as what would go)."""
    report = LeftoverReport(dry_run=dry_run)
    for root, below in folders:
        if root in fleet.failed_roots:
            continue
        storage = fleet.storage(root)
        stale: list[PartialWrite] = []
        try:
            found = list(storage.partial_writes(below))
        except StorageError as exc:  # this root only: the others are still swept
            fleet.set_aside(root, exc)
            continue
        for write in found:
            report.found.append(write)
            if write.started < older_than and not write.live:
                stale.append(write)
            else:
                report.young.append(f"{root}/{write.path}")
        if not stale:
            continue
        if dry_run:
            report.removed += [f"{root}/{w.path}" for w in stale]
            continue
        result = storage.abort_partial_writes(stale)
        report.removed += [f"{root}/{path}" for path in result.deleted]
        report.failed.update({f"{root}/{path}": why for path, why in result.failed.items()})
        settled = {*result.deleted, *result.failed}
        report.young += [f"{root}/{w.path}" for w in stale if w.path not in settled]
    return report
