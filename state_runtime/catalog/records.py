"""What the catalog hands back: small frozen records, free of SQL types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from state_runtime.identity import CheckpointRef, FileKind, StoreId


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
    created_at: datetime
    state: str
    state_reason: str | None

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)


@dataclass(frozen=True, slots=True)
class BatchCommit:
    """What ``commit_batch`` did: the stores committed, and what a replay replaced."""

    query_id: str
    batch_id: int
    committed: dict[StoreId, CheckpointRef]
    replaced: dict[StoreId, CheckpointRef]
    orphaned_files: int


@dataclass(frozen=True, slots=True)
class CommitEntry:
    """One row of the commit log."""

    key: StoreKey
    query_id: str
    batch_id: int
    ref: CheckpointRef
    committed_at: datetime


class Verdict(StrEnum):
    """Why a file is kept or may be deleted (``explain`` and the cleanup preview)."""

    NEEDED = "needed"  # a retained committed version loads through it
    WITHIN_WINDOW = "within_window"  # committed, not needed, younger than the retention window
    IN_FLIGHT = "in_flight"  # written, not committed, younger than the grace period
    ORPHAN_IN_GRACE = "orphan_in_grace"  # orphan younger than the grace period
    DELETABLE_SUPERSEDED = "deletable_superseded"
    DELETABLE_ORPHAN = "deletable_orphan"
    DELETABLE_UNCOMMITTED = "deletable_uncommitted"
    DELETING = "deleting"  # claimed by a cleanup run
    DELETED = "deleted"
    UNTRACKED = "untracked"  # the catalog has no record of this path

    @property
    def deletable(self) -> bool:
        return self in _DELETABLE


_DELETABLE = frozenset(
    {Verdict.DELETABLE_SUPERSEDED, Verdict.DELETABLE_ORPHAN, Verdict.DELETABLE_UNCOMMITTED}
)


@dataclass(frozen=True, slots=True)
class FileVerdict:
    """A file, the verdict on it and the reason in words."""

    file: FileRecord
    verdict: Verdict
    reason: str
    needed_by: tuple[int, int] | None  # (oldest, newest) retained version that needs it


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
