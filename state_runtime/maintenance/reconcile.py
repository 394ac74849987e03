"""The reconciliation sweep (rare): list storage, record the files the catalog does not know.

The one maintenance path that lists storage. A checkpoint file found under a root but absent
from the catalog (a task died between writing and recording, a restore, a bug) is read,
verified and recorded; the catalog then judges it like any file: committed if the commit log
names it, otherwise orphan or uncommitted, and cleanup deletes it once it is old enough.
Files younger than ``min_age`` may be in flight and are left for the next sweep; files whose
names are not checkpoint names are reported and never touched. Unfinished writes (temporary
files, incomplete multipart uploads) older than the grace for never-committed files are
removed (``leftovers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from state_runtime.catalog import FileState, RunKind
from state_runtime.errors import (
    CannotLoadState,
    CheckpointFileCorrupt,
    InvalidArgument,
    StorageError,
)
from state_runtime.identity import StoreId, parse_file_name
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.leftovers import (
    LeftoverReport,
    partial_write_cutoff,
    sweep_leftovers,
)
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.storage import FileInfo, Storage
from state_runtime.store.checkpoint_format import check_identity, checksum, read_header
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_verification import Expected, verify_bytes
from state_runtime.store.schema_files import fetch

RECORD_BATCH = 500


@dataclass
class ReconcileReport:
    dry_run: bool
    listed: int = 0
    untracked: list[str] = field(default_factory=list)
    recorded: dict[str, str] = field(default_factory=dict)  # path -> state now in the catalog
    in_flight: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    resurrected: list[str] = field(default_factory=list)  # recorded deleted, still on storage
    run_id: int | None = None
    leftovers: LeftoverReport = field(default_factory=LeftoverReport)

    def counts(self) -> dict[str, int]:
        return {
            "listed": self.listed,
            "untracked": len(self.untracked),
            "recorded": len(self.recorded),
            "in_flight": len(self.in_flight),
            "foreign": len(self.foreign),
            "unreadable": len(self.unreadable),
            "resurrected": len(self.resurrected),
        } | self.leftovers.counts()

    def summary(self) -> str:
        """The sweep in one line: what it listed, recorded (or would), and set aside."""
        c = self.counts()
        verb = "would record" if self.dry_run else "recorded"
        return (
            f"reconcile (run {self.run_id}): listed {c['listed']} files; {c['untracked']} "
            f"unknown to the catalog, {verb} {c['untracked'] - c['in_flight'] - c['unreadable']}; "
            f"{c['in_flight']} too young (maybe in flight), {c['unreadable']} unreadable, "
            f"{c['foreign']} not checkpoint files (left alone), {c['resurrected']} recorded "
            "deleted but present"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per file the sweep recorded (or would) or could not read: its ``path``,
        what it is ``recorded_as`` (its state, or why it is unreadable) and ``detail`` in
        words."""
        recorded = [
            {"path": path, "recorded_as": state, "detail": f"recorded {path} as {state}"}
            for path, state in self.recorded.items()
        ]
        unreadable = [
            {
                "path": path,
                "recorded_as": f"unreadable: {error}",
                "detail": f"unreadable {path}: {error}",
            }
            for path, error in self.unreadable.items()
        ]
        return recorded + unreadable


def _store_of(path: str) -> StoreId | None:
    """The store a path belongs to by the layout ``state/<op>/<part>/<name>/<file>``."""
    parts = path.split("/")
    if len(parts) != 5 or parts[0] != "state" or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    try:
        return StoreId(int(parts[1]), int(parts[2]), parts[3])
    except InvalidArgument:
        return None


def describe_file(storage: Storage, path: str, store: StoreId) -> CheckpointInfo:
    """Read and verify an untracked file, rows and all (validation trusts a format 3 file
    whose bytes match its record to parse: :func:`verify_bytes`); its record as the writer
    would have made it. CheckpointFileCorrupt naming the file if it does not verify."""
    parsed = parse_file_name(path.rsplit("/", 1)[-1])
    assert parsed is not None
    data = storage.read(path)
    header = read_header(data, path, store, parsed.ref)
    check_identity(header, store, parsed.ref, parsed.kind, path)
    info = CheckpointInfo(
        store=store,
        version=header.version,
        checkpoint_id=header.checkpoint_id,
        base_checkpoint_id=header.lineage[0].checkpoint_id if header.lineage else None,
        lineage=header.lineage,
        kind=header.kind,
        path=path,
        rows=header.state_rows,
        file_rows=header.file_rows,
        bytes_written=len(data),
        checksum=checksum(data),
        created_at=header.created_at,
    )
    expected = Expected(
        store, parsed.ref, parsed.kind, path, len(data), info.checksum, info.base_checkpoint_id
    )
    problem = verify_bytes(data, expected, lambda schema_id: fetch(storage, schema_id), rows=True)
    if problem is not None:
        raise CheckpointFileCorrupt(
            f"corrupt checkpoint file: {problem}",
            store=store,
            path=path,
            version=parsed.ref.version,
            checkpoint_id=parsed.ref.checkpoint_id,
        )
    return info


def reconcile(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    dry_run: bool = False,
    min_age: timedelta | None = None,
    now: datetime | None = None,
    progress: Progress = SILENT,
) -> ReconcileReport:
    """Sweep every root in scope; unless ``dry_run`` record what the catalog lacks."""
    min_age = policy.min_window if min_age is None else min_age
    now = now or fleet.catalog.now()  # the database's clock, as cleanup's
    report = ReconcileReport(dry_run=dry_run)
    parameters = policy.parameters() | {"min_age_s": min_age.total_seconds(), "dry_run": dry_run}
    with recorded_run(
        fleet.catalog, RunKind.RECONCILE, fleet.owner, parameters, policy.status_limits()
    ) as run:
        report.run_id = run.run_id
        roots = fleet.root_names()
        for root in roots:
            try:
                _sweep_root(fleet, root, report, dry_run, now - min_age, progress)
            except StorageError as exc:  # this root only: the others are still swept
                fleet.set_aside(root, exc)
        report.leftovers = sweep_leftovers(
            fleet,
            [(root, ["state"]) for root in roots],
            partial_write_cutoff(policy.retention, now),
            dry_run=dry_run,
        )
        run.counts = report.counts()
    return report


def _sweep_root(
    fleet: Fleet,
    root: str,
    report: ReconcileReport,
    dry_run: bool,
    young_after: datetime,
    progress: Progress,
) -> None:
    storage = fleet.storage(root)
    known = fleet.catalog.known_paths(root)
    listing: Sequence[FileInfo] = list(storage.list("state"))
    report.listed += len(listing)
    found: list[CheckpointInfo] = []
    with progress.stage(f"reconcile {root}", len(listing)) as advance:
        for info in listing:
            advance(1)
            state = known.get(info.path)
            if state == FileState.DELETED.value:
                report.resurrected.append(info.path)
                continue
            if state is not None:
                continue
            store = _store_of(info.path)
            if store is None or parse_file_name(info.path.rsplit("/", 1)[-1]) is None:
                report.foreign.append(info.path)
                continue
            report.untracked.append(info.path)
            # Not in the catalog, so no recorded time: the storage's modification time is the
            # file's only age (the storage's stamp, not its writer's); once recorded, it ages
            # from its recording as every catalogued file does.
            if info.modified > young_after:
                report.in_flight.append(info.path)
                continue
            try:
                found.append(describe_file(storage, info.path, store))
            except (CannotLoadState, StorageError) as exc:
                report.unreadable[info.path] = exc.reason
    if dry_run or not found:
        return
    assert report.run_id is not None
    for start in range(0, len(found), RECORD_BATCH):
        fleet.catalog.record_files(root, found[start : start + RECORD_BATCH], run_id=report.run_id)
    now_known = fleet.catalog.known_paths(root)
    report.recorded.update({info.path: now_known[info.path] for info in found})
