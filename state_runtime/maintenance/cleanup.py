"""The cleanup pass: delete what the catalog says is deletable; a dry run unless asked.

The plan comes from the catalog's inventory (no listing) under the retention rule of
:mod:`state_runtime.retention`: a snapshot replaces deltas only once verified, and a store with
an open validation failure is held (only its orphans may go; the plan lists each held store
with the reason and since when). The plan is counted in SQL (files and bytes per store and verdict,
a page of stores at a time); a dry run reads the first files in detail. Executing refuses a
retention below the safety floor, then, a chunk of stores at a time (about
:data:`CHUNK_FILES` files; several chunks at once, one per worker) under the stores' leases:
claims deletable files in the catalog, at most :data:`CHUNK_FILES` new ones a claim (and as
many an earlier run left claimed), again until a claim comes back short, each file once a
run (a concurrent commit can no longer reference them; the rule is evaluated again under
the store's lock, so a problem recorded meanwhile holds the store), deletes them from
storage in batches (S3: one ``DeleteObjects`` of up to 1,000 keys), and
records each batch's deletions with their reason in the ledger as soon as storage deleted
them: a store's backlog of any size is held a claim at a time. A run that stops anywhere leaves
claims behind that the next run resumes; deleting a file that is already gone is fine.
It also removes the stores' unfinished writes (temporary files of killed writers) older than
the grace and no live writer's (``leftovers``), held stores included: no version references
them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from state_runtime.catalog import (
    DeletableCount,
    FileVerdict,
    RetentionPolicy,
    RunKind,
    StoreKey,
    StoreProblem,
)
from state_runtime.errors import CatalogError
from state_runtime.maintenance.attempts import AttemptSweepReport, sweep_attempts
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.host_processes import spread_for
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
from state_runtime.maintenance.spread import Spread
from state_runtime.maintenance.workers import closing_items, map_bounded, worker_count
from state_runtime.units import size

T = TypeVar("T")
STORES_PER_CLAIM = 200
CHUNK_FILES = 1000
"""Files a chunk of stores is made of (about: a store is never split), and the most one
claim takes: what one worker claims, deletes and records at a time (a store with more is
worked through in claims of this many)."""
DELETE_BATCH = 1000
"""Files per storage delete (one S3 ``DeleteObjects`` takes at most 1,000 keys), each batch
recorded in the ledger as soon as it is deleted."""
SAMPLE = 100
"""A report keeps counters of everything, and the first ``SAMPLE`` files (planned, deleted,
failed) and stores in detail: its memory is bounded whatever the backlog."""
FILES_PER_STORE = 20


@dataclass(frozen=True)
class HeldStore:
    """A store cleanup holds: it has open validation problems (``reason``: the oldest)."""

    key: StoreKey
    reason: str
    since: datetime
    problems: int


@dataclass
class StoreTally:
    """One store's line in a cleanup report: its deletable files, the first few by name."""

    planned_files: int = 0
    planned_bytes: int = 0
    deleted_files: int = 0
    files: list[str] = field(default_factory=list)


@dataclass
class CleanupReport:
    """The plan (and the stores held back); when executed, also what was deleted, what
    failed and what was busy. Counters cover everything; ``planned`` (a dry run's),
    ``deleted``, ``failed`` and the per-store rows keep the first :data:`SAMPLE` of each,
    each row the first :data:`FILES_PER_STORE` files (planned, or when executed deleted)."""

    dry_run: bool
    policy: RetentionPolicy
    held: list[HeldStore] = field(default_factory=list)
    planned: list[FileVerdict] = field(default_factory=list)
    deleted: list[FileVerdict] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    busy: list[StoreKey] = field(default_factory=list)
    run_id: int | None = None
    leftovers: LeftoverReport = field(default_factory=LeftoverReport)
    attempts: AttemptSweepReport = field(default_factory=lambda: AttemptSweepReport(True))
    planned_files: int = 0
    planned_bytes: int = 0
    deleted_files: int = 0
    deleted_bytes: int = 0
    failed_files: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    stores: dict[StoreKey, StoreTally] = field(default_factory=dict)

    def plan(self, counts: Iterable[DeletableCount]) -> None:
        """Count a page of the plan's figures (per store and verdict) into the plan."""
        for count in counts:
            self.planned_files += count.files
            self.planned_bytes += count.size_bytes
            self.reasons[count.verdict.value] += count.files
            tally = self._tally(count.key)
            if tally is not None:
                tally.planned_files += count.files
                tally.planned_bytes += count.size_bytes

    def sample(self, verdicts: Iterable[FileVerdict]) -> None:
        """Keep files of the plan in detail: the first :data:`SAMPLE`, and the first
        :data:`FILES_PER_STORE` of each store with a row."""
        for v in verdicts:
            if len(self.planned) < SAMPLE:
                self.planned.append(v)
            self._name(v)

    def done(self, cleaned: _Cleaned) -> None:
        """Count what a chunk's worker deleted from storage (and recorded), and what failed."""
        self.deleted_files += cleaned.deleted_files
        self.deleted_bytes += cleaned.deleted_bytes
        for v in cleaned.deleted:
            if len(self.deleted) < SAMPLE:
                self.deleted.append(v)
            if not self.dry_run:
                self._name(v)
        for key, files in cleaned.per_store.items():
            tally = self.stores.get(key)
            if tally is not None:
                tally.deleted_files += files
        self.failed_files += cleaned.failed_files
        for path, why in list(cleaned.failed.items())[: max(0, SAMPLE - len(self.failed))]:
            self.failed[path] = why

    def _name(self, v: FileVerdict) -> None:
        tally = self.stores.get(v.file.key)
        if tally is not None and len(tally.files) < FILES_PER_STORE:
            tally.files.append(f"{v.file.path}: {v.reason}")

    def _tally(self, key: StoreKey) -> StoreTally | None:
        tally = self.stores.get(key)
        if tally is None and len(self.stores) < SAMPLE:
            tally = self.stores[key] = StoreTally()
        return tally

    def summary(self) -> str:
        """The pass in one line: what it deleted (or would) and why, what failed, the stores
        busy, and the stores held (only when there are any)."""
        if self.dry_run:
            breakdown = ", ".join(f"{n} {verdict}" for verdict, n in sorted(self.reasons.items()))
            line = f"cleanup (dry run): would delete {self.planned_files} files, " + size(
                self.planned_bytes
            )
            line += f" ({breakdown})" if breakdown else ""
        else:
            line = (
                f"cleanup (run {self.run_id}): deleted {self.deleted_files} files, "
                f"{size(self.deleted_bytes)}; {self.failed_files} failed; "
                f"{len(self.busy)} stores busy (leased by another run)"
            )
        if self.held:
            line += (
                f"; held: {len(self.held)} store(s) with open validation problems (nothing "
                "they committed is deleted until a validation passes or `statestore resolve`)"
            )
        return line

    def rows(self) -> list[dict[str, Any]]:
        """One row per store with deletable files (the first :data:`SAMPLE`) or held: the
        files (the first 20 with their reason), what was deleted, why it is held, and
        ``detail`` in words."""
        tallies = {str(key): tally for key, tally in self.stores.items()}
        held = {str(h.key): h for h in self.held}
        rows = []
        for store in sorted(set(tallies) | set(held)):
            tally = tallies.get(store, StoreTally())
            words: list[str] = []
            if tally.planned_files:
                deletable = size(tally.planned_bytes)
                words.append(f"{tally.planned_files} file(s) deletable, {deletable}")
                if not self.dry_run:
                    words.append(f"{tally.deleted_files} deleted")
            if store in held:
                words.append(
                    f"held since {held[store].since:%Y-%m-%d %H:%M:%S}, "
                    f"{held[store].problems} problem(s): {held[store].reason}"
                )
            rows.append(
                {
                    "store": store,
                    "planned_files": tally.planned_files,
                    "deleted_files": tally.deleted_files,
                    "held": held[store].reason if store in held else None,
                    "files": tally.files,
                    "detail": "; ".join(words),
                }
            )
        return rows

    def file_rows(self) -> list[dict[str, Any]]:
        """One row per file the pass deleted (in a dry run: would delete), the first
        :data:`SAMPLE`: ``file`` (root and path), ``bytes``, ``verdict`` and ``reason``."""
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
                "planned_files": self.planned_files,
                "planned_bytes": self.planned_bytes,
                "deleted_files": self.deleted_files,
                "deleted_bytes": self.deleted_bytes,
                "failed_files": self.failed_files,
                "busy_stores": len(self.busy),
                "held_stores": len(self.held),
            }
            | self.leftovers.counts()
            | self.attempts.counts()
        )


def _batches(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _chunks(page: Sequence[DeletableCount], files: int) -> Iterator[list[StoreKey]]:
    """A plan page's stores in chunks of fewer than ``files`` planned files, so that one
    claim of ``files`` comes back short and takes them all (a store is never split: one with
    more is a chunk of its own, worked through in claims), and at most
    :data:`STORES_PER_CLAIM` stores."""
    counts: Counter[StoreKey] = Counter()
    for count in page:
        counts[count.key] += count.files
    chunk: list[StoreKey] = []
    planned = 0
    for key in sorted(counts, key=str):
        if chunk and (planned + counts[key] >= files or len(chunk) >= STORES_PER_CLAIM):
            yield chunk
            chunk, planned = [], 0
        chunk.append(key)
        planned += counts[key]
    if chunk:
        yield chunk


def count_pages(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Set[StoreKey] | None = None,
    now: datetime | None = None,
) -> Iterator[list[DeletableCount]]:
    """The plan's figures (files and bytes per store and verdict), a page of stores at a
    time (:meth:`~state_runtime.catalog.Catalog.deletable_counts`): no row per file."""
    for root in fleet.query_roots(only):
        for page in fleet.catalog.deletable_counts(policy.retention, root=root, now=now):
            found = [c for c in page if fleet.in_scope(c.key, only)]
            if found:
                yield found


def _sample(fleet: Fleet, policy: MaintenancePolicy, report: CleanupReport, now: datetime) -> None:
    """A dry run's files in detail: those of the stores with a row, oldest first (one
    bounded read a store, never a store's whole backlog)."""
    for key, tally in list(report.stores.items()):
        if tally.planned_files:
            report.sample(
                fleet.catalog.deletable_files(
                    policy.retention,
                    root=key.root,
                    store=key.store,
                    now=now,
                    limit=max(FILES_PER_STORE, SAMPLE - len(report.planned)),
                )
            )


def plan_pages(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Set[StoreKey] | None = None,
    now: datetime | None = None,
) -> Iterator[list[FileVerdict]]:
    """What cleanup would delete now, a page of stores at a time (set-based SQL, keyset
    paging by store id: :meth:`~state_runtime.catalog.Catalog.deletable_pages`)."""
    for root in fleet.query_roots(only):
        for page in fleet.catalog.deletable_pages(policy.retention, root=root, now=now):
            found = [v for v in page if fleet.in_scope(v.file.key, only)]
            if found:
                yield found


def plan_cleanup(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> Iterator[FileVerdict]:
    """What cleanup would delete now, each file with its reason, streamed."""
    for page in plan_pages(fleet, policy, only=key_set(only), now=now):
        yield from page


def held_stores(fleet: Fleet, only: Set[StoreKey] | None = None) -> list[HeldStore]:
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
    delete_batch: int = DELETE_BATCH,
    chunk_files: int = CHUNK_FILES,
    workers: int | None = None,
    spread: Spread | None = None,
) -> CleanupReport:
    """Plan the cleanup and, unless ``dry_run``, carry it out (see the module docstring),
    page by page of stores, each page's stores in chunks of about ``chunk_files`` files that
    ``workers`` (:func:`worker_count`) claim, delete and record at once, in this process,
    this host's worker processes or the given ``spread``'s (:func:`spread_for` decides): what
    is held at any time is one page's plan and the chunks in flight (with a spread, the
    plan's chunks are read whole first).

    Raises MaintenanceRefused, touching nothing, if the retention is below the safety floor.
    """
    policy.check_retention()
    wanted = key_set(only)
    attempts = sweep_attempts(fleet, policy, dry_run=dry_run, now=now)
    report = CleanupReport(dry_run, policy.retention, held_stores(fleet, wanted))
    report.attempts = attempts
    leftovers_before = partial_write_cutoff(policy.retention, now or fleet.catalog.now())
    if dry_run:
        at = now or fleet.catalog.now()  # one time for the counts and the files in detail
        for counts in count_pages(fleet, policy, only=wanted, now=at):
            report.plan(counts)
        _sample(fleet, policy, report, at)
        report.leftovers = sweep_leftovers(
            fleet, store_folders(fleet, wanted), leftovers_before, dry_run=True
        )
        return report
    stores = fleet.store_count(wanted)
    with (
        recorded_run(
            fleet.catalog,
            RunKind.CLEANUP,
            fleet.owner,
            policy.parameters(),
            policy.status_limits(),
        ) as run,
        progress.stage("cleanup", stores) as advance,
    ):
        report.run_id = run.run_id
        parts = _parts(fleet, policy, report, wanted, now, chunk_files)
        work = partial(clean_parts, policy, run.run_id, now, delete_batch, chunk_files, workers)
        counted = 0
        on = spread_for(fleet, policy, spread, stores, "cleanup", workers)
        if on is None:  # threads for the stores are threads for their chunks: a lazy plan
            done: Iterator[_Cleaned] = work(fleet, parts)
        else:  # the whole plan first (its store keys): a spread deals its chunks at once,
            plan = list(parts)  # and decides by their count
            on = spread_for(fleet, policy, spread, len(plan), "cleanup", workers)
            done = work(fleet, plan) if on is None else on.map(fleet, plan, work)
        with closing_items(done) as cleaned_parts:
            for cleaned in cleaned_parts:
                report.busy += cleaned.busy
                report.done(cleaned)
                counted += cleaned.stores
                advance(cleaned.stores)
        advance(stores - counted)  # the stores with nothing to delete
        report.leftovers = sweep_leftovers(
            fleet, store_folders(fleet, wanted), leftovers_before, dry_run=False
        )
        run.counts = report.counts()
    return report


_Part = tuple[str, Sequence[StoreKey], int]
"""A chunk of stores of one root to clean, and how many of them the progress counts (none
for a stopped run's claims, resumed first)."""


def _parts(
    fleet: Fleet,
    policy: MaintenancePolicy,
    report: CleanupReport,
    wanted: Set[StoreKey] | None,
    now: datetime | None,
    chunk_files: int,
) -> Iterator[_Part]:
    """The chunks to clean: what a stopped run had claimed, then the plan's, page by page
    (each page counted into ``report``'s plan as it is read)."""
    resumed = {
        key
        for root in fleet.query_roots(wanted)
        for key in fleet.catalog.claimed_stores(root)
        if fleet.in_scope(key, wanted)
    }
    for root in sorted({key.root for key in resumed}):
        keys = sorted((k for k in resumed if k.root == root), key=str)
        for part in _batches(keys, STORES_PER_CLAIM):
            yield root, part, 0
    for page in count_pages(fleet, policy, only=wanted, now=now):
        report.plan(page)
        # a page of the whole catalog (query_roots: [None]) spans roots; a claim is of one
        by_root: dict[str, list[DeletableCount]] = {}
        for count in page:
            by_root.setdefault(count.key.root, []).append(count)
        for root, counts in by_root.items():
            for keys in _chunks(counts, chunk_files):
                yield root, keys, len(keys)


def clean_parts(
    policy: MaintenancePolicy,
    run_id: int,
    now: datetime | None,
    delete_batch: int,
    chunk_files: int,
    workers: int | None,
    fleet: Fleet,
    parts: Iterable[_Part],
) -> Iterator[_Cleaned]:
    """Clean ``parts`` under run ``run_id``, ``workers`` chunks at once (at most two queued
    a worker: the parts may be a plan read as it goes), in their order: the whole pass
    on one host, or one slice of it in a spread's worker. A chunk that raises stops the
    work: the chunks queued are cancelled, the running ones finish (each leaves the catalog
    and storage consistent: what a run claimed and did not record, the next run resumes),
    and the error is raised."""

    def clean(part: _Part) -> _Cleaned:
        root, keys, counted = part
        return _clean_stores(
            fleet, policy, root, keys, run_id, now, delete_batch, counted, chunk_files
        )

    yield from map_bounded(clean, parts, worker_count(fleet.catalog, policy, workers), "cleanup")


@dataclass
class _Cleaned:
    """What one chunk's worker did: files deleted (and recorded) and failed, counted, the
    first :data:`SAMPLE` of each kept; the stores another run held (or took from it)."""

    deleted: list[FileVerdict] = field(default_factory=list)
    deleted_files: int = 0
    deleted_bytes: int = 0
    per_store: Counter[StoreKey] = field(default_factory=Counter)
    failed: dict[str, str] = field(default_factory=dict)
    failed_files: int = 0
    busy: list[StoreKey] = field(default_factory=list)
    stores: int = 0
    """The chunk's stores the progress counts."""

    def add(self, batch: Sequence[FileVerdict], deleted: Set[str], failed: dict[str, str]) -> None:
        for v in batch:
            if v.file.path in deleted:
                self.deleted_files += 1
                self.deleted_bytes += v.file.size_bytes
                self.per_store[v.file.key] += 1
                if len(self.deleted) < SAMPLE:
                    self.deleted.append(v)
        self.failed_files += len(failed)
        for path, why in list(failed.items())[: max(0, SAMPLE - len(self.failed))]:
            self.failed[path] = why


def _clean_stores(
    fleet: Fleet,
    policy: MaintenancePolicy,
    root: str,
    keys: Sequence[StoreKey],
    run_id: int,
    now: datetime | None,
    delete_batch: int,
    counted: int,
    claim_files: int,
) -> _Cleaned:
    """Claim, delete and record the deletable files of ``keys`` whose leases are free, at
    most ``claim_files`` new and ``claim_files`` resumed files a claim (a store's backlog of
    any size goes in bounded claims, until both parts of a claim come back short; the run
    claims each file once, and what storage refused to delete stays claimed for the next
    run; each claim pages by keyset from where the last one's new files ended; after each
    delete batch the leases are renewed once a third of their time to live has passed, and a
    store whose lease was lost is dropped, its claimed files left for the next run); each
    batch of ``delete_batch`` files is recorded as soon as storage deleted it (``counted``:
    the chunk's stores the progress counts)."""
    catalog, storage = fleet.catalog, fleet.storage(root)
    cleaned = _Cleaned(stores=counted)
    with leased(catalog, keys, fleet.owner, policy.lease_ttl, run_id) as held:
        cleaned.busy += held.busy
        start: int | None = None  # the keyset: where the last claim's new files ended
        while held.leases:
            claimed = catalog.claim_deletions(
                run_id,
                policy.retention,
                root,
                [k.store for k in held.keys],
                limit=claim_files,
                now=now,
                from_version=start,
            )
            for part in _batches(claimed, delete_batch):
                kept = set(held.keys)  # a lost store's files stay claimed, for the next run
                batch = [v for v in part if v.file.key in kept]
                if batch:
                    result = storage.delete([v.file.path for v in batch])
                    done = set(result.deleted)
                    if done:
                        ids = [_claimed_id(v) for v in batch if v.file.path in done]
                        catalog.record_deletions_by_id(run_id, root, ids)
                    cleaned.add(batch, done, result.failed)
                held.renew()  # when due: one claim's batches on a slow store may outlast them
            fresh = [v for v in claimed if v.verdict.deletable]
            if len(fresh) < claim_files and len(claimed) - len(fresh) < claim_files:
                break
            start = fresh[-1].file.version if fresh else start
        cleaned.busy += held.lost  # its lease ran out mid-chunk: another run has it
    return cleaned


def _claimed_id(claimed: FileVerdict) -> int:
    """The catalog id a claim gave ``claimed`` (its deletion is recorded by it)."""
    if claimed.file_id is None:
        raise CatalogError(f"claimed file {claimed.file.path} came without its id")
    return claimed.file_id
