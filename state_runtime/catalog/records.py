"""What the catalog hands back: small frozen records, free of SQL types."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.retention import FileState, StoreFile, Verification
from state_runtime.retention import Verdict as Verdict  # the rule's verdicts, re-exported
from state_runtime.store.file_verification import Expected


@dataclass(frozen=True, slots=True)
class StoreKey:
    """A store with its checkpoint root: the full identity the catalog keys on."""

    root: str
    store: StoreId

    def __str__(self) -> str:
        return f"{self.root}#{self.store}"


@dataclass(frozen=True, slots=True)
class StoreRecord:
    """A store the catalog knows, with its schemas and latest committed version."""

    key: StoreKey
    key_schema: Any
    value_schema: Any
    created_at: datetime
    latest: CheckpointRef
    last_committed_at: datetime | None
    expired_through: int = 0
    """The newest version that expired (cleanup deleted what it loads from); 0: none."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One checkpoint file in the inventory."""

    key: StoreKey
    path: str
    kind: FileKind
    version: int
    checkpoint_id: str
    base_checkpoint_id: str | None
    size_bytes: int
    rows: int
    file_rows: int
    checksum: str
    created_at: datetime  # the writer's stamp, by its host's clock
    recorded_at: datetime  # when the catalog recorded the file, by the database's clock
    state: str
    state_reason: str | None
    verification: Verification = Verification.UNVERIFIED
    verified_at: datetime | None = None
    verification_note: str | None = None  # what the last failed verification found

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)

    def facts(self) -> StoreFile:
        """What the retention rule needs to know about this file."""
        return StoreFile(
            path=self.path,
            kind=self.kind,
            version=self.version,
            state=FileState(self.state),
            created_at=self.created_at,
            verification=self.verification,
            size=self.size_bytes,
            state_reason=self.state_reason,
            note=self.verification_note,
            recorded_at=self.recorded_at,
        )

    def expected(self) -> Expected:
        """What the file's bytes must be, as recorded."""
        return Expected(
            store=self.key.store,
            ref=self.ref,
            kind=self.kind,
            path=self.path,
            size=self.size_bytes,
            checksum=self.checksum,
            base_checkpoint_id=self.base_checkpoint_id,
        )


@dataclass(frozen=True, slots=True)
class BatchCommit:
    """What ``commit_batch`` did: the stores committed, what a replay replaced, and the open
    problems it closed (about files of the checkpoints it replaced)."""

    query_id: str
    batch_id: int
    committed: dict[StoreId, CheckpointRef]
    replaced: dict[StoreId, CheckpointRef]
    orphaned_files: int
    closed_problems: int = 0
    commit_ms: float = 0.0
    """The commit's work in its transaction (what the batch's metrics record as commit time)."""


@dataclass(frozen=True, slots=True)
class CommitEntry:
    """One row of the commit log."""

    key: StoreKey
    query_id: str
    batch_id: int
    ref: CheckpointRef
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class FileVerdict:
    """A file, the verdict on it and the reason in words."""

    file: FileRecord
    verdict: Verdict
    reason: str
    needed_by: tuple[int, int] | None  # (oldest, newest) retained version that needs it
    file_id: int | None = None
    """The catalog's id of the file (a claim's: its deletion is recorded by it, not by path)."""


@dataclass(frozen=True, slots=True)
class DeletableCount:
    """How many of a store's files cleanup may delete for one reason (``verdict``), and
    their bytes: the cleanup plan's figures, a row per store and verdict (not per file)."""

    key: StoreKey
    verdict: Verdict
    files: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Deletion:
    """A ledger entry: a file deleted, by which run, when and why."""

    key: StoreKey
    path: str
    size_bytes: int
    run_id: int
    reason: str
    deleted_at: datetime


@dataclass(frozen=True, slots=True)
class Explanation:
    """``explain(path)``: the file's record, if any, the verdict, and why."""

    root: str
    path: str
    verdict: Verdict
    reason: str
    file: FileRecord | None = None
    needed_by: tuple[int, int] | None = None
    deletion: Deletion | None = None


@dataclass(frozen=True, slots=True)
class RetainedVersion:
    """A retained committed version and the files the loader reads for it, oldest first (a
    snapshot or version 1's delta, then deltas). ``complete`` is False when the chain is
    broken: then ``files`` are those above the first version without a live file."""

    key: StoreKey
    ref: CheckpointRef
    files: tuple[FileRecord, ...]
    complete: bool


@dataclass(frozen=True, slots=True)
class SnapshotCandidate:
    """A store whose delta chain since its last committed snapshot reached the threshold."""

    key: StoreKey
    latest: CheckpointRef
    last_snapshot_version: int
    deltas_since_snapshot: int


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """One store's figures for dashboards (Dagster metadata, the CLI)."""

    key: StoreKey
    latest: CheckpointRef
    last_committed_at: datetime | None
    commit_lag: timedelta | None
    versions_behind: int
    last_snapshot_version: int
    deltas_since_snapshot: int
    state_rows: int
    live_files: int
    live_bytes: int
    orphan_files: int
    orphan_bytes: int
    reclaimable_files: int
    reclaimable_bytes: int
    last_run_id: int | None
    last_run_kind: str | None
    last_run_outcome: str | None
    last_run_ended_at: datetime | None
    # the facts a store's status is derived from (state_runtime/status.py)
    created_at: datetime
    open_problems: int
    first_problem: str | None  # the oldest open problem, naming its file
    problems_since: datetime | None  # when the oldest open problem was found
    last_resolved_at: datetime | None
    last_restored_at: datetime | None  # the last problem a restore resolved (not a validation)
    first_validated_at: datetime | None
    last_validated_at: datetime | None
    chain_since: datetime | None  # commit time of the first delta after the last snapshot
    oldest_orphan_at: datetime | None
    last_snapshot_at: datetime | None  # when the last verified snapshot was written
    versions_loadable: int  # committed versions that still load from the files kept
    recorded_status: str | None  # the status last recorded (store_status_changes), if any
    status_changed_at: datetime | None  # when that status was recorded as starting


@dataclass(frozen=True, slots=True)
class StatusChange:
    """A store's status as a health read derived it from facts that differ from its last
    recorded status: what :meth:`~state_runtime.catalog.Catalog.record_statuses` records.
    ``estimate``: since when, by the facts."""

    key: StoreKey
    status: str
    reason: str
    estimate: datetime | None


@dataclass(frozen=True, slots=True)
class StoreProblem:
    """Something validation found wrong with a store; open until a later validation no longer
    finds it or an operator resolves it. A store with an open problem is not cleaned."""

    problem_id: int
    key: StoreKey
    problem: str
    path: str | None
    version: int | None
    run_id: int | None
    detected_at: datetime
    resolved_at: datetime | None = None
    resolution: str | None = None

    def __str__(self) -> str:
        return problem_text(self.problem, self.path)


def problem_text(problem: str, path: str | None) -> str:
    """A problem as statuses and findings show it: what is wrong, and the file (unless the
    text names it already, as a damaged file's paragraph does)."""
    return problem + (f" (file {path})" if path and path not in problem else "")


@dataclass(frozen=True, slots=True)
class FoundProblem:
    """What a check found wrong, to record as a store problem."""

    problem: str
    path: str | None = None
    version: int | None = None


@dataclass(frozen=True, slots=True)
class Validated:
    """One store's validation, to record: each file read (None: intact, or the problem found),
    what was found wrong, and the ids of the problems open when the validation started (None:
    every open one). Only those are closed when not found again: one recorded since (the
    runtime found damage meanwhile) is left for the next validation. Ids, never times: a
    problem's ``detected_at`` is its recorder's clock (on SQLite, a driver's host's), which
    a validation's start on another host cannot be compared with."""

    key: StoreKey
    checked: Mapping[str, str | None]
    found: Sequence[FoundProblem]
    open_before: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class Repair:
    """A damaged snapshot rebuilt from its deltas: what was found, and when each step ended."""

    key: StoreKey
    path: str
    run_id: int
    problem: str
    damaged_size: int | None  # None: the damaged copy was already gone
    damaged_sha256: str | None
    old_checksum: str
    old_size: int
    started_at: datetime
    removed_at: datetime | None
    finished_at: datetime | None


DISK_FIGURES = (
    "resident_bytes",
    "local_disk_bytes",
    "block_cache_hits",
    "block_cache_misses",
    "compaction_bytes",
)
"""The figures of :class:`BatchMetrics` about state on the workers' local disk, in the order
the catalog's columns and views show them."""


@dataclass(frozen=True, slots=True)
class BatchMetrics:
    """Runtime figures for one micro-batch (filled by the Spark runtime)."""

    rows_in: int
    keys_updated: int
    state_rows: int
    bytes_written: int
    commit_ms: float
    cache_hits: int
    cache_misses: int
    extra: dict[str, Any] = field(default_factory=dict)
    # State on the workers' local disk (docs/state-on-disk.md), summed over the batch's stores
    # and tasks: bytes their committed versions hold in memory and in files on local disk,
    # block reads served by the block cache or not, bytes merges wrote to local disk.
    resident_bytes: int = 0
    local_disk_bytes: int = 0
    block_cache_hits: int = 0
    block_cache_misses: int = 0
    compaction_bytes: int = 0

    def figures(self) -> dict[str, float]:
        """The numbers a monitor plots (Dagster, OpenTelemetry): the recorded figures and the
        runtime's numeric extras (``batch_ms``, ``max_load_ms``, ``cache_hit_rate``, ...)."""
        figures: dict[str, float] = {
            "rows_in": self.rows_in,
            "keys_updated": self.keys_updated,
            "state_rows": self.state_rows,
            "bytes_written": self.bytes_written,
            "commit_ms": self.commit_ms,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            **{name: getattr(self, name) for name in DISK_FIGURES},
        }
        looked = self.cache_hits + self.cache_misses
        if looked:
            figures["cache_hit_rate"] = self.cache_hits / looked
        for name, value in self.extra.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                figures[name] = value
        return figures


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A reader's place in rows that concurrent writers record (batch metrics, maintenance
    runs): the id of the transaction that wrote a row, then the row's id (0 on SQLite, where
    one writer at a time commits, and for rows from before the catalog recorded it). A read
    after a position returns only rows whose transaction ended, as does every older one, in
    this order: no row can become visible behind a position once read (docs/catalog.md)."""

    xact: int = 0
    row: int = 0


@dataclass(frozen=True, slots=True)
class Unsettled:
    """Rows after a reader's positions that a read does not return yet: their transaction,
    or an older writing transaction of the PostgreSQL server, is still open. ``oldest_write``
    is how long the oldest open writing transaction (or prepared one) has been open, None
    when the catalog's role sees none (another role's sessions are hidden without
    ``pg_read_all_stats``)."""

    rows: int = 0
    oldest_write: timedelta | None = None


@dataclass(frozen=True, slots=True)
class RecordedBatchMetrics:
    root: str
    query_id: str
    batch_id: int
    metrics: BatchMetrics
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class MaintenanceRun:
    run_id: int
    kind: str
    owner: str
    parameters: dict[str, Any]
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    counts: dict[str, Any]
    error: str | None
    host: str | None = None  # the host (and process namespace) of the process that runs it
    pid: int | None = None
    heartbeat_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """A per-store maintenance lease: held until released or ``expires_at``."""

    key: StoreKey
    token: str
    owner: str
    run_id: int | None
    expires_at: datetime
    store_id: int
    """The catalog's id of the store: renewing and releasing look nothing up."""


@dataclass(frozen=True, slots=True)
class StartedRun:
    """What :meth:`Catalog.begin_run` did in its one transaction: the run it started, the
    abandoned runs it closed first, and the leases asked for (None where another holds one)."""

    run_id: int
    abandoned: list[MaintenanceRun]
    leases: list[Lease | None]


@dataclass(frozen=True, slots=True)
class BatchWatermark:
    """The event-time watermark a batch ran with, and the largest event time it saw (ms)."""

    batch_id: int
    watermark_ms: int
    max_event_ms: int | None


@dataclass(frozen=True, slots=True)
class CommittedDelta:
    """The delta file one batch committed for one store, with its inventory state; ``path``
    and ``state`` are None when the batch changed nothing in the store (no file, no changes)."""

    store: StoreId
    query_id: str
    batch_id: int
    ref: CheckpointRef
    path: str | None
    state: str | None


@dataclass(frozen=True, slots=True)
class RecoveryCost:
    """What a cold load of a store's latest committed version reads."""

    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class HistoryFile:
    """A file written for a committed version: its delta or a snapshot, and its fate."""

    path: str
    kind: FileKind
    size_bytes: int
    file_rows: int
    state: str
    verification: str
    created_at: datetime
    deleted_at: datetime | None = None
    deletion_run: int | None = None
    deletion_reason: str | None = None


@dataclass(frozen=True, slots=True)
class VersionHistory:
    """One committed version of a store (a line of ``statestore history``): the batch that
    committed it, its state rows, and the files of its checkpoint id."""

    key: StoreKey
    ref: CheckpointRef
    query_id: str
    batch_id: int
    committed_at: datetime
    rows: int
    files: tuple[HistoryFile, ...]

    @property
    def bytes_written(self) -> int:
        """Bytes of the delta the commit wrote (snapshots come later, from maintenance)."""
        return sum(f.size_bytes for f in self.files if f.kind is FileKind.DELTA)

    @property
    def snapshots(self) -> tuple[HistoryFile, ...]:
        return tuple(f for f in self.files if f.kind is FileKind.SNAPSHOT)

    @property
    def deleted(self) -> tuple[HistoryFile, ...]:
        return tuple(f for f in self.files if f.deleted_at is not None)


Suspects = Collection[StoreId] | Literal["all"]
"""The stores of a batch that may hold unrecorded attempt files ("all": every store)."""


@dataclass(frozen=True, slots=True)
class BatchStart:
    """What the driver reads as a batch starts (in the transaction that records its intent):
    the query's last committed batch (with one of its stores), the checkpoint each store
    committed in the previous batch, the batch its latest restore returned it to (a
    position the commit log lacks when the restore restarted every store from empty), and
    the current layout of each of the batch's operators (a repartition's names the batch
    from which it holds: the batches before ran on the old layout)."""

    last_batch: int | None
    last_store: StoreId | None
    previous: dict[StoreId, CheckpointRef]
    restored: int | None = None
    layouts: dict[tuple[int, str], Layout] = field(default_factory=dict)
    restarted_base: bool = False
    """The commit log has nothing of the previous batch, and a restore (not the latest),
    ended after the query's last commit of an earlier batch, returned the query to it,
    restarting every store there: the batch starts from empty
    stores (a later restore kept the batches after it)."""
    expired: dict[StoreId, int] = field(default_factory=dict)
    """The stores whose version in ``previous`` has expired (cleanup deleted files it loads
    through, ``stores.expired_through``), with the newest expired version: no file holds the
    state the batch would build on."""


@dataclass(frozen=True, slots=True)
class AttemptSweep:
    """A settled batch intent whose stores may hold files the driver never recorded: the
    store folders to list and the version whose unrecorded files belong to the run's attempts."""

    run: str
    root: str
    query_id: str
    batch_id: int
    committed: bool
    targets: dict[StoreId, int]


@dataclass(frozen=True, slots=True)
class Layout:
    """An operator's partition layout from batch ``from_batch`` on: its partition count and
    how rows route (``routing``: the key columns' names and Spark types, as the runtime saw
    them in the input; a row goes to ``pmod(hash(columns), num_partitions)``). A layout set
    by a repartition starts at ``from_version`` (a snapshot of every partition) and names its
    run; the first layout of an operator names no run."""

    root: str
    operator_id: int
    store_name: str
    seq: int
    query_id: str
    num_partitions: int
    routing: list[dict[str, Any]]
    from_batch: int
    from_version: int
    run_id: int | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class NewLayout:
    """An operator's layout to record: its partition count and routing (see :class:`Layout`)."""

    operator_id: int
    store_name: str
    num_partitions: int
    routing: list[dict[str, Any]]


class NamesMark(NamedTuple):
    """What the stores' names follow, compared between reads (``StoreNames.current``)."""

    stores: int
    newest: int
    roots: tuple[str, ...]
    pairs: int
    """The (root, query) pairs the commit log has ever held (``root_queries``): a query first
    committing below a root (new, renamed, moved), whatever its batch numbers."""
    newest_pair: int
