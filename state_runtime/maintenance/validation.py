"""Lineage validation: every retained committed version is loadable, checked file by file.

For each store, the catalog names the retained versions and the files that load each one.
Validation checks that the commit log is linear over those versions, that each chain is
complete in the inventory, and reads every file once: it exists, has the recorded size and
checksum, parses and verifies, carries the identity its name says, and its lineage links to
the file below it. Each problem is a finding that names the file.
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from state_runtime.catalog import FileRecord, RetainedVersion, StoreKey, StoreRecord
from state_runtime.checkpoint_format import check_identity, checksum, decode
from state_runtime.errors import CannotLoadState, StorageError, StorageFileNotFound
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.storage import Storage


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

    def __str__(self) -> str:
        where = f" (file {self.path})" if self.path else ""
        return f"{self.key}: {self.problem}{where}"


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
    workers: int = 1,
) -> ValidationReport:
    """Validate every store in scope (see the module docstring)."""
    records = fleet.stores(only)
    results: list[StoreValidation] = []
    with (
        progress.stage("validation", len(records)) as advance,
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
    ):
        for result in pool.map(lambda r: _validate_store(fleet, policy, r), records):
            results.append(result)
            advance(1)
    return ValidationReport(results)


def _validate_store(
    fleet: Fleet, policy: MaintenancePolicy, record: StoreRecord
) -> StoreValidation:
    key = record.key
    result = StoreValidation(key)
    latest = record.latest.version
    if latest == 0:
        return result
    retain = policy.retention.retain_versions
    retained = fleet.catalog.retained_versions(key.root, key.store, retain)
    result.versions = len(retained)

    def error(problem: str, path: str | None = None, version: int | None = None) -> None:
        result.findings.append(Finding(key, Severity.ERROR, problem, path, version))

    expected = list(range(latest, max(0, latest - retain), -1))
    found = [r.ref.version for r in retained]
    if found != expected:
        error(f"commit log is not linear: retained versions {found}, expected {expected}")
    by_version = {r.ref.version: r for r in retained}
    files: dict[str, FileRecord] = {}
    for version in retained:
        top = next((f for f in reversed(version.files) if f.version == version.ref.version), None)
        below = by_version.get(version.ref.version - 1)
        if (
            top is not None
            and below is not None
            and top.base_checkpoint_id != below.ref.checkpoint_id
        ):
            error(
                f"commit log is not linear: version {version.ref.version} builds on "
                f"{version.ref.version - 1}_{top.base_checkpoint_id}, but "
                f"{below.ref} is committed",
                top.path,
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
    storage = fleet.storage(key.root)
    for file in sorted(files.values(), key=lambda f: (f.version, f.kind)):
        result.files += 1
        problem, size = _check_file(storage, file)
        result.bytes_read += size
        if problem is not None:
            error(problem, file.path, file.version)
    return result


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


def _check_file(storage: Storage, record: FileRecord) -> tuple[str | None, int]:
    """Read one file and verify it against its catalog record: (problem or None, bytes read)."""
    try:
        data = storage.read(record.path)
    except StorageFileNotFound:
        return "file is missing from storage", 0
    except StorageError as exc:
        return f"file cannot be read: {exc.reason}", 0
    if len(data) != record.size_bytes:
        return f"size is {len(data)} bytes, the catalog recorded {record.size_bytes}", len(data)
    if checksum(data) != record.checksum:
        return "checksum differs from the one the catalog recorded", len(data)
    try:
        header, _ = decode(data, record.path, record.key.store, record.ref)
        check_identity(header, record.key.store, record.ref, record.kind, record.path)
    except CannotLoadState as exc:
        return exc.reason, len(data)
    parent = header.lineage[0] if header.lineage else None
    expected = (
        None
        if record.base_checkpoint_id is None
        else CheckpointRef(record.version - 1, record.base_checkpoint_id)
    )
    if parent != expected:
        return (
            f"lineage in the file starts at {parent or 'version 0'}, the catalog says "
            f"{expected or 'version 0'}"
        ), len(data)
    return None, len(data)
