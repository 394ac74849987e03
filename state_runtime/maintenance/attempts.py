"""The attempt sweep: files of failed, speculative or zombie task attempts, found without
listing every store.

Tasks record nothing in the catalog: the driver records the files its task reports name, in
the batch's commit. A file written by an attempt whose report never reached the driver (a
task killed after writing, a speculative copy that lost, a driver that died before its
commit) is found through the batch's intent (:mod:`state_runtime.catalog.sql.batch_intents`):
only intents settled with suspect stores, or never settled, and older than ``min_age`` (a
younger batch may still have attempts running), are swept; each lists just its suspect
stores' folders and records the files of the batch's version that the catalog lacks. Those
then follow the retention rule like any orphan (committed elsewhere: orphan; never
committed: uncommitted), and cleanup deletes them once they are old enough. A normal batch
costs the sweep nothing. Runs at the start of every cleanup pass (a dry run only reports).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from state_runtime.errors import CannotLoadState, StorageError
from state_runtime.identity import StoreId, parse_file_name
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.reconcile import describe_file
from state_runtime.store.checkpoint_info import CheckpointInfo

SWEEPS_PER_CALL = 100


@dataclass
class AttemptSweepReport:
    dry_run: bool
    intents: int = 0
    listed_stores: int = 0
    found: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            "attempt_intents": self.intents,
            "attempt_stores_listed": self.listed_stores,
            "attempt_files_found": len(self.found),
            "attempt_files_recorded": len(self.recorded),
        }


def sweep_attempts(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    dry_run: bool = True,
    min_age: timedelta | None = None,
    now: datetime | None = None,
) -> AttemptSweepReport:
    """Sweep the batch intents that may have left files behind (see the module docstring);
    unless ``dry_run`` record the files found and mark the intents swept."""
    min_age = policy.min_window if min_age is None else min_age
    cutoff = (now or fleet.catalog.now()) - min_age  # the database's clock, as the intents'
    report = AttemptSweepReport(dry_run=dry_run)
    roots = set(fleet.root_names())
    while True:
        sweeps = [
            s for s in fleet.catalog.attempt_sweeps(cutoff, SWEEPS_PER_CALL) if s.root in roots
        ]
        if not sweeps:
            return report
        done = []
        for sweep in sweeps:
            report.intents += 1
            try:
                found = _unrecorded(fleet, sweep.root, sweep.targets, report)
            except StorageError as exc:  # this root only: its intents stay for the next pass
                fleet.set_aside(sweep.root, exc)
                roots.discard(sweep.root)
                continue
            if not dry_run and found:
                fleet.catalog.record_files(sweep.root, found)
                report.recorded += [info.path for info in found]
            done.append(sweep.run)
        if dry_run:
            return report
        fleet.catalog.finish_attempt_sweeps(done, forget_before=cutoff)
        if not done:
            return report


def _unrecorded(
    fleet: Fleet, root: str, targets: Mapping[StoreId, int], report: AttemptSweepReport
) -> list[CheckpointInfo]:
    """The checkpoint files at each target store's version that the catalog lacks."""
    storage = fleet.storage(root)
    candidates: dict[str, StoreId] = {}
    for store, version in sorted(targets.items()):
        report.listed_stores += 1
        for info in storage.list(store.directory):
            parsed = parse_file_name(info.path.rsplit("/", 1)[-1])
            if parsed is not None and parsed.version == version:
                candidates[info.path] = store
    known = fleet.catalog.recorded_paths(root, candidates)
    found = []
    for path, store in sorted(candidates.items()):
        if path in known:
            continue
        report.found.append(path)
        try:
            found.append(describe_file(storage, path, store))
        except (CannotLoadState, StorageError) as exc:
            report.unreadable[path] = exc.reason
    return found
