"""Lineage validation: every retained committed version is loadable, checked file by file.

For each store, validation first verifies the snapshots that are not verified yet at or above
the store's floor (a snapshot the snapshot pass wrote but could not verify, one found damaged
before, one from a catalog older than verification): a verified one may now replace deltas.
Then the catalog names the retained versions and the files that load each one; validation
checks that the commit log is linear over those versions, that each chain is complete in the
inventory, and reads every file once: it exists, has the recorded size and checksum, parses
and verifies, carries the identity its name says, and its lineage links to the file below it.

Each problem is a finding that names the file; one about a damaged committed file says its
fate and the next command (:func:`state_runtime.maintenance.damage.classify`). What
validation found is recorded in the catalog: each file read is verified or failed, and the
store's open problems become exactly its findings: a store with an open problem is broken and
not cleaned, until a validation finds nothing wrong or an operator resolves the problems.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from state_runtime.catalog import (
    FileRecord,
    FileState,
    FoundProblem,
    RetainedVersion,
    StoreKey,
    StoreRecord,
)
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.maintenance.damage import Damage, classify
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.restore import Verified
from state_runtime.maintenance.workers import worker_count
from state_runtime.retention import Verdict
from state_runtime.store.file_verification import verify_file


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One problem with one store, naming the file when there is one."""

    key: StoreKey
    severity: Severity
    problem: str
    path: str | None = None
    version: int | None = None
    damage: Damage | None = None
    """A damaged committed file's classification (its fate and next command)."""

    @property
    def said(self) -> str:
        """The problem as recorded and shown: with a damaged file's fate and next command."""
        return self.problem if self.damage is None else self.damage.paragraph(store=False)

    def __str__(self) -> str:
        where = f" (file {self.path})" if self.path and self.damage is None else ""
        return f"{self.key}: {self.said}{where}"


@dataclass
class StoreValidation:
    key: StoreKey
    versions: int = 0
    files: int = 0
    bytes_read: int = 0
    findings: list[Finding] = field(default_factory=list)


@dataclass
class ValidationReport:
    stores: list[StoreValidation]

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.stores for f in s.findings]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def counts(self) -> dict[str, int]:
        return {
            "stores": len(self.stores),
            "versions": sum(s.versions for s in self.stores),
            "files": sum(s.files for s in self.stores),
            "bytes_read": sum(s.bytes_read for s in self.stores),
            "errors": len(self.errors),
            "stores_with_errors": len({f.key for f in self.errors}),
        }


def validate_stores(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    progress: Progress = SILENT,
    workers: int | None = None,
    run_id: int | None = None,
) -> ValidationReport:
    """Validate every store in scope, ``workers`` at once (:func:`worker_count`), and record
    what was found (see the module docstring); ``run_id``: the validation run that records
    it."""
    records = fleet.stores(only)
    pending = _unconfirmed_snapshots(fleet, policy, only)
    results: list[StoreValidation] = []
    with (
        progress.stage("validation", len(records)) as advance,
        ThreadPoolExecutor(worker_count(fleet.catalog, policy, workers)) as pool,
    ):
        for result in pool.map(
            lambda r: _validate_store(fleet, policy, r, pending.get(r.key, []), run_id), records
        ):
            results.append(result)
            advance(1)
    return ValidationReport(results)


def _unconfirmed_snapshots(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None
) -> dict[StoreKey, list[FileRecord]]:
    """Per store, the snapshots the retention rule keeps as unverified or damaged (committed,
    at or above the floor, not verified): once verified they may replace deltas."""
    pending: dict[StoreKey, list[FileRecord]] = {}
    for root in fleet.query_roots(only):
        for verdict in fleet.catalog.file_verdicts(policy.retention, root=root):
            if verdict.verdict in (Verdict.UNVERIFIED, Verdict.DAMAGED):
                pending.setdefault(verdict.file.key, []).append(verdict.file)
    return pending


def _validate_store(
    fleet: Fleet,
    policy: MaintenancePolicy,
    record: StoreRecord,
    unconfirmed: Sequence[FileRecord],
    run_id: int | None,
) -> StoreValidation:
    key, catalog = record.key, fleet.catalog
    started = catalog.now()
    result = StoreValidation(key)
    checked: dict[str, str | None] = {}
    storage = fleet.storage(key.root)

    def error(problem: str, path: str | None = None, version: int | None = None) -> None:
        result.findings.append(Finding(key, Severity.ERROR, problem, path, version))

    def check(file: FileRecord) -> str | None:
        if file.path not in checked:
            result.files += 1
            problem, size = verify_file(storage, file.expected())
            result.bytes_read += size
            checked[file.path] = problem
            if problem is not None:
                error(problem, file.path, file.version)
        return checked[file.path]

    if record.latest.version:
        confirmed = {f.path: None for f in unconfirmed if check(f) is None}
        if confirmed:  # verified snapshots now replace deltas: the chains change
            catalog.record_verifications(key.root, confirmed)
        _check_chains(fleet, policy, record, check, error, result)
        result.findings = _classified(fleet, key, result.findings, checked)
    found = [FoundProblem(f.said, f.path, f.version) for f in result.findings]
    catalog.record_validation(run_id, key, checked, found, started_at=started)
    return result


def _classified(
    fleet: Fleet, key: StoreKey, findings: list[Finding], checked: dict[str, str | None]
) -> list[Finding]:
    """``findings``, each about a damaged committed file classified as every tool does (what
    it says then names the file's fate and the next command)."""
    if not any(checked.get(f.path or "") for f in findings):
        return findings
    records = {f.path: f for f in fleet.catalog.store_files(key.root, key.store)}
    known = Verified(problems=dict(checked))
    out = []
    for finding in findings:
        record = records.get(finding.path or "")
        cause = checked.get(finding.path or "")
        if record is None or cause is None or record.state != FileState.COMMITTED:
            out.append(finding)
            continue
        damage = classify(fleet, record, cause, checked=known)
        out.append(dataclasses.replace(finding, damage=damage))
    return out


def _check_chains(
    fleet: Fleet,
    policy: MaintenancePolicy,
    record: StoreRecord,
    check: Callable[[FileRecord], str | None],
    error: Callable[[str, str | None, int | None], None],
    result: StoreValidation,
) -> None:
    """Check the retained versions' chains: linear, complete, every file intact."""
    key, latest = record.key, record.latest.version
    retain = policy.retention.retain_versions
    retained = fleet.catalog.retained_versions(key.root, key.store, retain)
    result.versions = len(retained)
    # A store's chain may begin at a snapshot without lineage (a repartition's): the
    # versions below it belong to another layout.
    start = max((r.ref.version for r in retained if _starts_chain(r)), default=1)
    expected = list(range(latest, max(start - 1, latest - retain), -1))
    found = [r.ref.version for r in retained if r.ref.version >= start]
    if found != expected:
        error(
            f"commit log is not linear: retained versions {found}, expected {expected}", None, None
        )
    by_version = {r.ref.version: r for r in retained}
    files: dict[str, FileRecord] = {}
    for version in (r for r in retained if r.ref.version >= start):
        top = next((f for f in reversed(version.files) if f.version == version.ref.version), None)
        below = by_version.get(version.ref.version - 1)
        # a complete version without a file of its own changed nothing: it commits its
        # parent's checkpoint, so it builds on its own id
        base = top.base_checkpoint_id if top is not None else None
        if top is None and version.complete:
            base = version.ref.checkpoint_id
        if base is not None and below is not None and base != below.ref.checkpoint_id:
            error(
                f"commit log is not linear: version {version.ref.version} builds on "
                f"{version.ref.version - 1}_{base}, but {below.ref} is committed",
                None if top is None else top.path,
                version.ref.version,
            )
        if not version.complete:
            missing, path = _gap(version)
            error(
                f"version {version.ref.version} cannot be loaded: the catalog has no live "
                f"file for version {missing}{_why_gone(fleet, policy, key, path)}",
                path,
                version.ref.version,
            )
        files.update({f.path: f for f in version.files})
    for file in sorted(files.values(), key=lambda f: (f.version, f.kind)):
        check(file)


def _starts_chain(version: RetainedVersion) -> bool:
    """The version loads from a snapshot of its own that records no ancestor."""
    first = version.files[0] if version.files else None
    return (
        first is not None
        and first.kind is FileKind.SNAPSHOT
        and first.version == version.ref.version
        and first.base_checkpoint_id is None
    )


def _gap(version: RetainedVersion) -> tuple[int, str]:
    """The version a broken chain stops at, and the delta path expected for it: the catalog's
    walk follows base ids down from the version and stops at the first file it lacks."""
    files = version.files
    if files and files[0].base_checkpoint_id is not None:
        ref = CheckpointRef(files[0].version - 1, files[0].base_checkpoint_id)
    else:
        ref = version.ref
    assert ref.checkpoint_id is not None
    return ref.version, version.key.store.file_path(ref.version, ref.checkpoint_id, FileKind.DELTA)


def _why_gone(fleet: Fleet, policy: MaintenancePolicy, key: StoreKey, path: str) -> str:
    """What the catalog knows about a file a chain lacks (deleted by whom, or never seen)."""
    return f"; {fleet.catalog.explain(key.root, path, policy.retention).reason}"
