"""``explain``: why a file is kept or may go, checked against storage, with its store's status.

The catalog answers from its inventory; a file it counts on is also looked up in storage (one
request), so that a file that is gone is never called "needed": the answer says what is lost
and what still loads without it. A missing or damaged committed file is classified as every
tool does (:func:`state_runtime.maintenance.damage.classify`): its fate and the next command;
a missing one is recorded as a problem on its store.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from datetime import datetime

from state_runtime.catalog import Explanation, FileRecord, FileState, FoundProblem, Verdict
from state_runtime.errors import CatalogPermissionDenied
from state_runtime.maintenance.damage import Damage, classify
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.health import store_reports
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.status import Status
from state_runtime.store.file_verification import MISSING, verify_file


@dataclass(frozen=True)
class FileExplanation:
    """The catalog's explanation of a file, and the status of the store it belongs to."""

    explanation: Explanation
    status: Status | None
    damage: Damage | None = None


def explain_file(
    fleet: Fleet, root: str, path: str, policy: MaintenancePolicy, *, now: datetime | None = None
) -> FileExplanation:
    """Why the file at ``path`` (relative to ``root``) is kept, or why it may be deleted."""
    catalog = fleet.catalog
    found = catalog.explain(root, path, policy.retention, now=now)
    record = found.file
    if record is None:
        return FileExplanation(found, None)
    live = record.state in {s.value for s in (FileState.WRITTEN, FileState.COMMITTED)}
    committed = record.state == FileState.COMMITTED
    if live and not fleet.storage(root).exists(path):
        found = catalog.explain(root, path, policy.retention, now=now, absent=True)
    cause = _damage_found(fleet, record, found) if committed else None
    damage = None if cause is None else classify(fleet, record, cause)
    if damage is not None and found.verdict is not Verdict.DAMAGED:
        if found.verdict is Verdict.MISSING:  # a fact, for health and repair
            lost = FoundProblem(damage.paragraph(store=False), path, record.version)
            with contextlib.suppress(CatalogPermissionDenied):  # a reader: validate records it
                catalog.add_problems(record.key, [lost])
        else:  # an open problem named the file, and reading it shows the damage
            found = dataclasses.replace(
                found, verdict=Verdict.DAMAGED, reason=f"{record.kind.value} {cause}"
            )
    reports = store_reports(fleet, policy, only=[record.key], now=now)
    return FileExplanation(found, reports[0].status if reports else None, damage)


def _damage_found(fleet: Fleet, record: FileRecord, found: Explanation) -> str | None:
    """What is wrong with the committed file ``record``: missing, its failed verification,
    or, when an open problem of its store names it (the runtime found it damaged), what
    reading it shows now; None if nothing is known to be wrong."""
    if found.verdict is Verdict.MISSING:
        return MISSING
    if found.verdict is Verdict.DAMAGED:
        return record.verification_note or "its last verification failed"
    if not any(p.path == record.path for p in fleet.catalog.problems(store=record.key)):
        return None
    problem, _ = verify_file(fleet.storage(record.key.root), record.expected())
    return problem
