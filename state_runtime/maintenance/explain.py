"""``explain``: why a file is kept or may go, checked against storage, with its store's status.

The catalog answers from its inventory; a file it counts on is also looked up in storage (one
request), so that a file that is gone is never called "needed": the answer says what is lost
and what still loads without it. A missing or damaged committed file is classified as every
tool does (:func:`state_runtime.maintenance.damage.classify`): its fate and the next command;
a missing one is recorded as a problem on its store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from state_runtime.catalog import Explanation, FileState, FoundProblem, Verdict
from state_runtime.maintenance.damage import Damage, classify
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.health import store_reports
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.status import Status
from state_runtime.store.file_verification import MISSING


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
    damage = None
    if committed and found.verdict in (Verdict.MISSING, Verdict.DAMAGED):
        cause = MISSING if found.verdict is Verdict.MISSING else record.verification_note
        damage = classify(fleet, record, cause or "its last verification failed")
        if found.verdict is Verdict.MISSING:  # a fact, for health and repair
            lost = FoundProblem(damage.paragraph(store=False), path, record.version)
            catalog.add_problems(record.key, [lost])
    reports = store_reports(fleet, policy, only=[record.key], now=now)
    return FileExplanation(found, reports[0].status if reports else None, damage)
