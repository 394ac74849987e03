"""The cleanup pass: delete what the catalog says is deletable; a dry run unless asked.

The plan comes from the catalog's inventory (no listing) under the retention rule of
:mod:`state_runtime.retention`: a snapshot replaces deltas only once verified, and a store with
an open validation failure is held (only its orphans may go; the plan lists each held store
with the reason and since when). Executing refuses a retention below the safety floor, then,
store by store under the store's lease: claims the deletable files in the catalog (a
concurrent commit can no longer reference them; the rule is evaluated again under the store's
lock, so a problem recorded meanwhile holds the store), deletes them from storage in batches,
and records each deletion with its reason in the ledger. A run that stops anywhere leaves
claims behind that the next run resumes; deleting a file that is already gone is fine.
It also removes the stores' unfinished writes (temporary files of killed writers) older than
the grace and no live writer's (``leftovers``), held stores included: no version references
them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from state_runtime.catalog import FileVerdict, RetentionPolicy, RunKind, StoreKey, StoreProblem
from state_runtime.maintenance.attempts import AttemptSweepReport, sweep_attempts
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.leases import leased
from state_runtime.maintenance.leftovers import (
    LeftoverReport,
    partial_write_cutoff,
    store_folders,
    sweep_leftovers,
)
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.units import size

T = TypeVar("T")
STORES_PER_CLAIM = 200


@dataclass(frozen=True)
class HeldStore:
    """A store cleanup holds: it has open validation problems (``reason``: the oldest)."""

    key: StoreKey
    reason: str
    since: datetime
    problems: int


@dataclass
class CleanupReport:
    """The plan (and the stores held back); when executed, also what was deleted, what
    failed and what was busy."""

    dry_run: bool
    policy: RetentionPolicy
    planned: list[FileVerdict]
    held: list[HeldStore] = field(default_factory=list)
    deleted: list[FileVerdict] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    busy: list[StoreKey] = field(default_factory=list)
    run_id: int | None = None
    leftovers: LeftoverReport = field(default_factory=LeftoverReport)
    attempts: AttemptSweepReport = field(default_factory=lambda: AttemptSweepReport(True))

    @property
    def planned_bytes(self) -> int:
        return sum(v.file.size_bytes for v in self.planned)

    @property
    def deleted_bytes(self) -> int:
        return sum(v.file.size_bytes for v in self.deleted)

    def summary(self) -> str:
        """The pass in one line: what it deleted (or would) and why, what failed, the stores
        busy, and the stores held (only when there are any)."""
        if self.dry_run:
            reasons = Counter(v.verdict.value for v in self.planned)
            breakdown = ", ".join(f"{n} {verdict}" for verdict, n in sorted(reasons.items()))
            line = f"cleanup (dry run): would delete {len(self.planned)} files, " + size(
                self.planned_bytes
            )
            line += f" ({breakdown})" if breakdown else ""
        else:
            line = (
                f"cleanup (run {self.run_id}): deleted {len(self.deleted)} files, "
                f"{size(self.deleted_bytes)}; {len(self.failed)} failed; "
                f"{len(self.busy)} stores busy (leased by another run)"
            )
        if self.held:
            line += (
                f"; held: {len(self.held)} store(s) with open validation problems (nothing "
                "they committed is deleted until a validation passes or `statestore resolve`)"
            )
        return line

    def rows(self) -> list[dict[str, Any]]:
        """One row per store with deletable files or held: the files (the first 20 with their
        reason), what was deleted, why it is held, and ``detail`` in words."""
        by_store: dict[str, list[FileVerdict]] = {}
        for verdict in self.planned:
            by_store.setdefault(str(verdict.file.key), []).append(verdict)
        deleted: dict[str, int] = {}
        for verdict in self.deleted:
            deleted[str(verdict.file.key)] = deleted.get(str(verdict.file.key), 0) + 1
        held = {str(h.key): h for h in self.held}
        rows = []
        for store in sorted(set(by_store) | set(held)):
            planned = by_store.get(store, [])
            words: list[str] = []
            if planned:
                deletable = size(sum(v.file.size_bytes for v in planned))
                words.append(f"{len(planned)} file(s) deletable, {deletable}")
            if planned and not self.dry_run:
                words.append(f"{deleted.get(store, 0)} deleted")
            if store in held:
                words.append(
                    f"held since {held[store].since:%Y-%m-%d %H:%M:%S}, "
                    f"{held[store].problems} problem(s): {held[store].reason}"
                )
            rows.append(
                {
                    "store": store,
                    "planned_files": len(planned),
                    "deleted_files": deleted.get(store, 0),
                    "held": held[store].reason if store in held else None,
                    "files": [f"{v.file.path}: {v.reason}" for v in planned[:20]],
                    "detail": "; ".join(words),
                }
            )
        return rows

    def file_rows(self) -> list[dict[str, Any]]:
        """One row per file the pass deleted (in a dry run: would delete): ``file`` (root and
        path), ``bytes``, ``verdict`` and ``reason`` in the rule's words."""
        return [
            {
                "file": f"{v.file.key.root}/{v.file.path}",
                "bytes": v.file.size_bytes,
                "verdict": v.verdict.value,
                "reason": v.reason,
            }
            for v in (self.planned if self.dry_run else self.deleted)
        ]

    def counts(self) -> dict[str, int]:
        return (
            {
                "planned_files": len(self.planned),
                "planned_bytes": self.planned_bytes,
                "deleted_files": len(self.deleted),
                "deleted_bytes": self.deleted_bytes,
                "failed_files": len(self.failed),
                "busy_stores": len(self.busy),
                "held_stores": len(self.held),
            }
            | self.leftovers.counts()
            | self.attempts.counts()
        )


def _batches(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def plan_cleanup(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> list[FileVerdict]:
    """What cleanup would delete now, each file with its reason."""
    return [
        verdict
        for root in fleet.query_roots(only)
        for verdict in fleet.catalog.deletable_files(policy.retention, root=root, now=now)
        if fleet.in_scope(verdict.file.key, only)
    ]


def held_stores(fleet: Fleet, only: Collection[StoreKey] | None = None) -> list[HeldStore]:
    """The stores in scope that cleanup holds, each with its oldest open problem."""
    by_store: dict[StoreKey, list[StoreProblem]] = {}
    for root in fleet.query_roots(only):
        for problem in fleet.catalog.problems(root=root):
            if fleet.in_scope(problem.key, only):
                by_store.setdefault(problem.key, []).append(problem)
    return [
        HeldStore(key, str(found[0]), found[0].detected_at, len(found))
        for key, found in sorted(by_store.items(), key=lambda kv: str(kv[0]))
    ]


def cleanup_pass(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    dry_run: bool = True,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
    progress: Progress = SILENT,
    delete_batch: int = 1000,
) -> CleanupReport:
    """Plan the cleanup and, unless ``dry_run``, carry it out (see the module docstring).

    Raises MaintenanceRefused, touching nothing, if the retention is below the safety floor.
    """
    policy.check_retention()
    attempts = sweep_attempts(fleet, policy, dry_run=dry_run, now=now)
    planned = plan_cleanup(fleet, policy, only=only, now=now)
    report = CleanupReport(dry_run, policy.retention, planned, held_stores(fleet, only))
    report.attempts = attempts
    folders = store_folders(fleet, only)
    leftovers_before = partial_write_cutoff(policy.retention, now or fleet.catalog.now())
    if dry_run:
        report.leftovers = sweep_leftovers(fleet, folders, leftovers_before, dry_run=True)
        return report
    work: dict[str, set[StoreKey]] = {}
    for verdict in report.planned:
        work.setdefault(verdict.file.key.root, set()).add(verdict.file.key)
    for root in fleet.query_roots(only):
        for key in fleet.catalog.claimed_stores(root):
            if fleet.in_scope(key, only):
                work.setdefault(key.root, set()).add(key)
    parameters = policy.parameters() | {"stores": sum(len(keys) for keys in work.values())}
    with (
        recorded_run(
            fleet.catalog, RunKind.CLEANUP, fleet.owner, parameters, policy.status_limits()
        ) as run,
        progress.stage("cleanup", sum(len(keys) for keys in work.values())) as advance,
    ):
        report.run_id = run.run_id
        for root, keys in sorted(work.items()):
            for part in _batches(sorted(keys, key=str), STORES_PER_CLAIM):
                _clean_stores(fleet, policy, root, part, report, now, delete_batch)
                advance(len(part))
        report.leftovers = sweep_leftovers(fleet, folders, leftovers_before, dry_run=False)
        run.counts = report.counts()
    return report


def _clean_stores(
    fleet: Fleet,
    policy: MaintenancePolicy,
    root: str,
    keys: Sequence[StoreKey],
    report: CleanupReport,
    now: datetime | None,
    delete_batch: int,
) -> None:
    """Claim, delete and record the deletable files of ``keys`` whose leases are free."""
    catalog, storage = fleet.catalog, fleet.storage(root)
    assert report.run_id is not None
    with leased(catalog, keys, fleet.owner, policy.lease_ttl, report.run_id) as held:
        report.busy += held.busy
        if not held.leases:
            return
        claimed = catalog.claim_deletions(
            report.run_id, policy.retention, root, [k.store for k in held.keys], now=now
        )
        for batch in _batches(claimed, delete_batch):
            result = storage.delete([v.file.path for v in batch])
            if result.deleted:
                catalog.record_deletions(report.run_id, root, result.deleted)
            done = set(result.deleted)
            report.deleted += [v for v in batch if v.file.path in done]
            report.failed.update(result.failed)
