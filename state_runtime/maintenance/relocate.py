"""Moving a checkpoint root: point the catalog at the root's new home once its files are there.

The catalog stores every file's path relative to its root, and each store's root once, so a
root copied or moved elsewhere (another folder, another bucket) needs one catalog change: its
root. Before that change every committed file the catalog knows below the old root must be
found at the new one; otherwise nothing changes. The pass is a dry run unless asked to execute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from state_runtime.catalog import Catalog, FileState
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.storage import Storage, open_storage


@dataclass
class RelocationReport:
    """What relocating ``old`` to ``new`` checked and did."""

    old: str
    new: str
    files_checked: int
    missing: list[str] = field(default_factory=list)
    stores_moved: int = 0
    executed: bool = False

    def summary(self) -> str:
        """What was checked at the new root and, when executed, the stores moved."""
        found = self.files_checked - len(self.missing)
        line = (
            f"relocate {self.old} -> {self.new}: {found} of {self.files_checked} committed "
            "file(s) found at the new root"
        )
        if self.executed:
            line += f"; {self.stores_moved} store(s) now recorded below {self.new}"
        return line

    def rows(self) -> list[dict[str, Any]]:
        """One row per committed file missing at the new root: its ``path`` and ``detail``."""
        return [{"path": path, "detail": f"missing {path}"} for path in self.missing]


def relocate_root(
    catalog: Catalog, old: str, new: str | Storage, *, dry_run: bool = True
) -> RelocationReport:
    """Check that every committed file below root ``old`` is at ``new``, then (with
    ``dry_run``) record ``new`` as those stores' root. A ``new`` the catalog already knows is
    bad input (:class:`InvalidArgument`). Raises :class:`MaintenanceRefused`
    when asked to execute while files are missing: the catalog is left unchanged."""
    storage = new if isinstance(new, Storage) else open_storage(new)
    if storage.uri in catalog.roots():
        raise InvalidArgument(f"the catalog already records stores below {storage.uri}")
    known = catalog.known_paths(old)
    committed = sorted(path for path, state in known.items() if state == FileState.COMMITTED.value)
    report = RelocationReport(old=old, new=storage.uri, files_checked=len(committed))
    report.missing = [path for path in committed if not storage.exists(path)]
    if dry_run:
        return report
    if report.missing:
        raise MaintenanceRefused(
            f"{len(report.missing)} committed file(s) below {old} are not at {storage.uri} "
            f"(first: {report.missing[0]}); the catalog is unchanged"
        )
    report.stores_moved = catalog.relocate_root(old, storage.uri)
    report.executed = True
    return report
