"""Lineage validation: every retained committed version is loadable, checked file by file.

For each store, validation first verifies the snapshots that are not verified yet at or above
the store's floor (a snapshot the snapshot pass wrote but could not verify, one found damaged
before, one from a catalog older than verification): a verified one may now replace deltas.
Then the catalog names the retained versions and the files that load each one; validation
checks that the commit log is linear over those versions, that each chain is complete in the
inventory, and reads each file it selects once: it exists, has the recorded size and checksum,
parses and verifies, carries the identity its name says, and its lineage links to the file
below it.

What is read follows what changed since the last run (:func:`files_to_read`): a file never
verified, one not intact when last read (or whose record changed since: a rewrite resets its
verification), one an open problem names, and ``verify_sample_percent`` percent of the others,
the longest unread first, so that bit rot is still found: at ``p`` percent a file is read
again on average once every ``100 / p`` runs (5, the default: every 20 runs; a store's share
is rounded by a random draw, so in a store of few files one may wait longer), and a file
damaged in place with its size kept is found in about that many runs; 100 (``--full``)
reads every file. The files not read are checked present with their recorded size by one
listing of the store's folder, so a missing or resized file is found every run. A run's
counts say what it read: ``files_new`` (never verified), ``files_rechecked`` (failed when
last read, named by an open problem, or not vouched for by the listing) and
``files_sampled`` (verified before, read again by the sample).

Each problem is a finding that names the file; one about a damaged committed file says its
fate and the next command (:func:`state_runtime.maintenance.damage.classify`). What
validation found is recorded in the catalog: each file read is verified or failed, and the
store's open problems become exactly its findings: a store with an open problem is broken and
not cleaned, until a validation finds nothing wrong or an operator resolves the problems.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from itertools import islice

from state_runtime.catalog import (
    FileRecord,
    FileState,
    FoundProblem,
    RetainedVersion,
    StoreKey,
    StoreRecord,
    Validated,
    Verification,
)
from state_runtime.errors import StorageError
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.maintenance.chains import Verified
from state_runtime.maintenance.damage import Damage, classify
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.host_processes import spread_for
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.spread import Spread
from state_runtime.maintenance.workers import closing_items, map_bounded, worker_count
from state_runtime.retention import Verdict
from state_runtime.retention import retained_versions as retained_version_numbers
from state_runtime.storage import Storage
from state_runtime.store.file_verification import MISSING, verify_file


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
    """Files read and verified."""
    new: int = 0
    """Of ``files``: never verified (recorded since the last run, or rewritten)."""
    rechecked: int = 0
    """Of ``files``: not intact when last read, named by an open problem, or resized (or
    unlisted: the listing failed)."""
    sampled: int = 0
    """Of ``files``: verified before, read again by the sample (or a full run)."""
    present: int = 0
    """Files not read, found present with their recorded size."""
    bytes_read: int = 0
    findings: list[Finding] = field(default_factory=list)


FINDINGS_KEPT = 1000
"""A report keeps the first this many errors in detail (and counts every one): its memory is
bounded whatever the fleet and however much of it is broken; the catalog keeps every store's
open problems."""


@dataclass
class ValidationReport:
    """What a validation found, summed over its stores as each chunk is done (no store's
    result is held: a fleet of 100,000 stores costs what a fleet of 100 does); ``errors``:
    the first :data:`FINDINGS_KEPT` (``error_count``: all of them)."""

    stores: int = 0
    versions: int = 0
    files: int = 0
    present: int = 0
    new: int = 0
    rechecked: int = 0
    sampled: int = 0
    bytes_read: int = 0
    error_count: int = 0
    stores_with_errors: int = 0
    errors: list[Finding] = field(default_factory=list)

    def add(self, store: StoreValidation) -> None:
        """Count one store's validation in."""
        self.stores += 1
        self.versions += store.versions
        self.files += store.files
        self.present += store.present
        self.new += store.new
        self.rechecked += store.rechecked
        self.sampled += store.sampled
        self.bytes_read += store.bytes_read
        errors = [f for f in store.findings if f.severity is Severity.ERROR]
        self.error_count += len(errors)
        self.stores_with_errors += bool(errors)
        self.errors += errors[: max(0, FINDINGS_KEPT - len(self.errors))]

    @property
    def ok(self) -> bool:
        return not self.error_count

    def counts(self) -> dict[str, int]:
        return {
            "stores": self.stores,
            "versions": self.versions,
            "files": self.files,
            "files_present": self.present,
            "files_new": self.new,
            "files_rechecked": self.rechecked,
            "files_sampled": self.sampled,
            "bytes_read": self.bytes_read,
            "errors": self.error_count,
            "stores_with_errors": self.stores_with_errors,
        }


def validate_stores(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    progress: Progress = SILENT,
    workers: int | None = None,
    run_id: int | None = None,
    sampler: random.Random | None = None,
    spread: Spread | None = None,
) -> ValidationReport:
    """Validate every store in scope, ``workers`` at once (:func:`worker_count`), in this
    process, this host's worker processes or, given a ``spread``, its workers (each slice
    ``workers`` at once; :func:`spread_for` decides), and record
    what was found (see the module docstring); ``run_id``: the validation run that records
    it; ``sampler``: where each store's rounding draw of the sample comes from (seed one to
    make a run's choice repeatable; the draws are taken in store order on the calling host,
    whatever the workers)."""
    draw = (sampler or random.Random()).random
    # The problems open at the run's start, read before anything else: a problem recorded
    # after it (the runtime finding damage meanwhile) stays open for the next run, never
    # closed unread. By id, not by time: a driver on SQLite records its problems by its own
    # host's clock, which may be ahead of this one's. Only the scope's roots: a run over a
    # few stores does not read every open problem of the catalog.
    wanted = key_set(only)
    started = frozenset(
        p.problem_id
        for root in fleet.query_roots(wanted)
        for p in fleet.catalog.problems(root=root)
    )
    total = fleet.store_count(wanted)
    # the draws are taken here, in store order, a page of stores at a time
    records = ((record, draw()) for page in fleet.store_pages(wanted) for record in page)
    work = partial(validate_slice, policy, run_id, started, workers, wanted)
    on = spread_for(fleet, policy, spread, total, "validation", workers)
    done = work(fleet, records) if on is None else on.map(fleet, list(records), work)
    report = ValidationReport()
    with progress.stage("validation", total) as advance, closing_items(done) as results:
        for result in results:
            report.add(result)
            advance(1)
    return report


def validate_slice(
    policy: MaintenancePolicy,
    run_id: int | None,
    started: frozenset[int],
    workers: int | None,
    only: Set[StoreKey] | None,
    fleet: Fleet,
    records: Iterable[tuple[StoreRecord, float]],
) -> Iterator[StoreValidation]:
    """Validate ``records`` (each store with its sample draw) in chunks, ``workers`` at once,
    recording each chunk's findings under ``run_id``: the whole pass on one host, or one
    slice of it in a spread's worker (``only``: the pass's scope; a slice's, given as a list,
    narrows it to its stores, so that each slice reads its roots' pending snapshots and open
    problems, not the whole scope's). ``records`` is read as the workers free up, so a fleet
    of any size streams through."""
    if isinstance(records, Sequence):  # a spread's slice: what its own stores' roots hold
        only = key_set([record.key for record, _ in records])
    pending = _unconfirmed_snapshots(fleet, policy, only)
    named = _named_by_problems(fleet, policy, only)
    count = worker_count(fleet.catalog, policy, workers)

    def validate(chunk: Sequence[tuple[StoreRecord, float]]) -> list[StoreValidation]:
        return _validate_chunk(fleet, policy, chunk, pending, named, run_id, started)

    for done in map_bounded(validate, _chunks(records, count), count, "validation"):
        yield from done


CHUNK_STORES = 50
"""Stores validated, and recorded, together: their retained versions are read in one query
and their findings recorded in one transaction (a few statements, not a few per store)."""


def _chunks(
    records: Iterable[tuple[StoreRecord, float]], workers: int
) -> Iterator[list[tuple[StoreRecord, float]]]:
    """``records`` in runs of one root, each of at most :data:`CHUNK_STORES` stores, read a
    window of one chunk a worker at a time; a window that is not full (a small fleet, the
    last stores) is split in a ``workers``-th each, so that it still spreads over the
    workers."""
    items = iter(records)
    while page := list(islice(items, CHUNK_STORES * workers)):
        size = max(1, min(CHUNK_STORES, -(-len(page) // workers)))
        chunk: list[tuple[StoreRecord, float]] = []
        for item in page:
            if chunk and (len(chunk) == size or item[0].key.root != chunk[0][0].key.root):
                yield chunk
                chunk = []
            chunk.append(item)
        if chunk:
            yield chunk


def _validate_chunk(
    fleet: Fleet,
    policy: MaintenancePolicy,
    chunk: Sequence[tuple[StoreRecord, float]],
    pending: Mapping[StoreKey, Sequence[FileRecord]],
    named: Mapping[StoreKey, Collection[str]],
    run_id: int | None,
    started: frozenset[int],
) -> list[StoreValidation]:
    """Validate a chunk of stores of one root: one read of their retained versions, each
    store's files, one transaction recording what was found."""
    root = chunk[0][0].key.root
    retained = fleet.catalog.retained_versions_of(
        root, [r.key.store for r, _ in chunk], policy.retention.retain_versions
    )
    results, validated = [], []
    for record, draw in chunk:
        key = record.key
        result, found = _validate_store(
            fleet,
            policy,
            record,
            retained.get(key.store, []),
            pending.get(key, []),
            named.get(key, set()),
            draw,
            started,
        )
        results.append(result)
        validated.append(found)
    fleet.catalog.record_validations(run_id, validated)
    return results


def _unconfirmed_snapshots(
    fleet: Fleet, policy: MaintenancePolicy, only: Set[StoreKey] | None
) -> dict[StoreKey, list[FileRecord]]:
    """Per store, the snapshots the retention rule keeps as unverified or damaged (committed,
    at or above the floor, not verified): once verified they may replace deltas."""
    pending: dict[StoreKey, list[FileRecord]] = {}
    for root in fleet.query_roots(only):
        for verdict in fleet.catalog.unconfirmed_snapshots(policy.retention, root=root):
            if verdict.verdict in (Verdict.UNVERIFIED, Verdict.DAMAGED):
                pending.setdefault(verdict.file.key, []).append(verdict.file)
    return pending


def _named_by_problems(
    fleet: Fleet, policy: MaintenancePolicy, only: Set[StoreKey] | None
) -> dict[StoreKey, set[str]]:
    """Per store, the files its open problems name (read again, so that a validation settles
    each problem on what it finds now); nothing to look up when every file is read."""
    named: dict[StoreKey, set[str]] = {}
    if policy.verify_sample_percent < 100:
        for root in fleet.query_roots(only):
            for problem in fleet.catalog.problems(root=root):
                if problem.path is not None:
                    named.setdefault(problem.key, set()).add(problem.path)
    return named


def files_to_read(
    files: Sequence[FileRecord], percent: int, named: Collection[str], draw: float
) -> tuple[list[FileRecord], list[FileRecord]]:
    """The files to read and those only to check present, each in ``files``' order.

    Read: a file never verified or not intact when last read, one ``named`` (by an open
    problem), and ``percent`` percent of the others, the longest unread first. ``draw`` (in
    [0, 1)) rounds that share up or down so that it averages ``percent`` percent even for a
    store of few files."""
    if percent >= 100:
        return list(files), []
    old = sorted(
        (
            f
            for f in files
            if f.verification == Verification.VERIFIED
            and f.verified_at is not None
            and f.path not in named
        ),
        key=lambda f: (f.verified_at, f.version, f.kind.value),
    )
    due = int(len(old) * percent / 100 + draw)
    unread = {f.path for f in old[due:]}
    return [f for f in files if f.path not in unread], [f for f in files if f.path in unread]


def _listed_sizes(storage: Storage, key: StoreKey) -> dict[str, int] | None:
    """The size of each file in the store's folder, by path: one listing (None if it fails;
    the files are read instead)."""
    try:
        return {info.path: info.size for info in storage.list(key.store.directory)}
    except StorageError:
        return None


def _validate_store(
    fleet: Fleet,
    policy: MaintenancePolicy,
    record: StoreRecord,
    retained: Sequence[RetainedVersion],
    unconfirmed: Sequence[FileRecord],
    named: Collection[str],
    draw: float,
    started: frozenset[int],
) -> tuple[StoreValidation, Validated]:
    """One store's validation (``retained``: its retained versions as the chunk read them),
    and what to record of it (``started``: the problems open at the run's start, those that
    are not found again are closed)."""
    key, catalog = record.key, fleet.catalog
    result = StoreValidation(key)
    checked: dict[str, str | None] = {}
    storage = fleet.storage(key.root)

    def error(problem: str, path: str | None = None, version: int | None = None) -> None:
        result.findings.append(Finding(key, Severity.ERROR, problem, path, version))

    def check(file: FileRecord, resized: bool = False) -> str | None:
        if file.path not in checked:
            result.files += 1
            if resized or file.verification == Verification.FAILED or file.path in named:
                result.rechecked += 1
            elif file.verification == Verification.VERIFIED:
                result.sampled += 1
            else:
                result.new += 1
            # a file verified with its record's checksum was decoded whole then: once its
            # bytes hash to that checksum, its rows need not be decoded again
            verified = file.verification == Verification.VERIFIED
            problem, size = verify_file(storage, file.expected(), parsed=verified)
            result.bytes_read += size
            checked[file.path] = problem
            if problem is not None:
                error(problem, file.path, file.version)
        return checked[file.path]

    if record.latest.version:
        confirmed = {f.path: None for f in unconfirmed if check(f) is None}
        if confirmed:  # verified snapshots now replace deltas: the chains change
            catalog.record_verifications(key.root, confirmed)
            retained = catalog.retained_versions(
                key.root, key.store, policy.retention.retain_versions
            )
        files = _check_chains(fleet, policy, record, retained, error, result)
        read, unread = files_to_read(files, policy.verify_sample_percent, named, draw)
        sizes = _listed_sizes(storage, key) if unread else {}
        reading = {f.path for f in read}
        for file in files:
            size = None if sizes is None else sizes.get(file.path)
            if file.path in reading:
                check(file)
            elif sizes is None or (size is not None and size != file.size_bytes):
                check(file, resized=True)  # the listing failed, or the size changed
            elif size is None:  # the same finding as reading it would give
                checked[file.path] = MISSING
                error(MISSING, file.path, file.version)
            else:
                result.present += 1
        result.findings = _classified(fleet, key, result.findings, checked)
    found = [FoundProblem(f.said, f.path, f.version) for f in result.findings]
    return result, Validated(key, checked, found, started)


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
    retained: Sequence[RetainedVersion],
    error: Callable[[str, str | None, int | None], None],
    result: StoreValidation,
) -> list[FileRecord]:
    """Check the retained versions' chains (linear, complete); their files, oldest first."""
    key, latest = record.key, record.latest.version
    retain = policy.retention.retain_versions
    result.versions = len(retained)
    # A store's chain may begin at a snapshot without lineage (a repartition's): the
    # versions below it belong to another layout.
    start = max((r.ref.version for r in retained if _starts_chain(r)), default=1)
    expected = [
        v for v in retained_version_numbers(latest, retain, record.expired_through) if v >= start
    ]
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
    return sorted(files.values(), key=lambda f: (f.version, f.kind))


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
