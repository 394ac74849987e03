"""The SQL catalog: system of record for stores, checkpoint files, commits and maintenance.

PostgreSQL in production, SQLite as the embedded default; the URL comes from
``STATE_CATALOG_URL``. The schema is owned by the Alembic migrations shipped in this package
(``python -m state_runtime.catalog upgrade``). See ``docs/catalog.md``.
"""

from state_runtime.catalog.catalog import Catalog
from state_runtime.catalog.connection.engine import RetryPolicy
from state_runtime.catalog.connection.settings import (
    URL_ENV,
    CatalogTimeouts,
    catalog_url,
    catalog_url_of,
)
from state_runtime.catalog.records import (
    DISK_FIGURES,
    AttemptSweep,
    BatchCommit,
    BatchMetrics,
    BatchStart,
    BatchWatermark,
    CommitEntry,
    CommittedDelta,
    DeletableCount,
    Deletion,
    Explanation,
    FileRecord,
    FileVerdict,
    FoundProblem,
    HistoryFile,
    Layout,
    Lease,
    MaintenanceRun,
    NewLayout,
    Position,
    RecordedBatchMetrics,
    RecoveryCost,
    Repair,
    RetainedVersion,
    SnapshotCandidate,
    StatusChange,
    StoreHealth,
    StoreKey,
    StoreProblem,
    StoreRecord,
    Suspects,
    Unsettled,
    Validated,
    Verdict,
    VersionHistory,
)
from state_runtime.catalog.schema.administration import (
    grant_statements,
    revision_line,
    upgrade_catalog,
)
from state_runtime.catalog.schema.revision import head_revision, upgrade
from state_runtime.catalog.schema.tables import FileState, RunKind, RunOutcome, Verification
from state_runtime.catalog.sql.runs_and_leases import HEARTBEAT_INTERVAL
from state_runtime.retention import RetentionPolicy
from state_runtime.settings import MIN_RETAINED_VERSIONS

__all__ = [
    "DISK_FIGURES",
    "HEARTBEAT_INTERVAL",
    "MIN_RETAINED_VERSIONS",
    "URL_ENV",
    "AttemptSweep",
    "BatchCommit",
    "BatchMetrics",
    "BatchStart",
    "BatchWatermark",
    "Catalog",
    "CatalogTimeouts",
    "CommitEntry",
    "CommittedDelta",
    "Deletion",
    "Explanation",
    "FileRecord",
    "FileState",
    "DeletableCount",
    "FileVerdict",
    "FoundProblem",
    "HistoryFile",
    "Layout",
    "Lease",
    "MaintenanceRun",
    "NewLayout",
    "Position",
    "RecordedBatchMetrics",
    "RecoveryCost",
    "Repair",
    "Validated",
    "RetainedVersion",
    "RetentionPolicy",
    "RetryPolicy",
    "RunKind",
    "RunOutcome",
    "SnapshotCandidate",
    "StatusChange",
    "StoreHealth",
    "StoreKey",
    "StoreProblem",
    "StoreRecord",
    "Suspects",
    "Unsettled",
    "Verdict",
    "Verification",
    "VersionHistory",
    "catalog_url",
    "catalog_url_of",
    "grant_statements",
    "head_revision",
    "revision_line",
    "upgrade",
    "upgrade_catalog",
]
