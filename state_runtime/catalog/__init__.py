"""The SQL catalog: system of record for stores, checkpoint files, commits and maintenance.

PostgreSQL in production, SQLite as the embedded default; the URL comes from
``STATE_CATALOG_URL``. The schema is owned by the Alembic migrations shipped in this package
(``python -m state_runtime.catalog upgrade``). See ``docs/catalog.md``.
"""

from state_runtime.catalog.catalog import Catalog
from state_runtime.catalog.engine import RetryPolicy
from state_runtime.catalog.records import (
    BatchCommit,
    BatchMetrics,
    CommitEntry,
    Deletion,
    Explanation,
    FileRecord,
    FileVerdict,
    Lease,
    MaintenanceRun,
    RecordedBatchMetrics,
    RetainedVersion,
    SnapshotCandidate,
    StoreHealth,
    StoreKey,
    StoreRecord,
    Verdict,
)
from state_runtime.catalog.retention import MIN_RETAINED_VERSIONS, RetentionPolicy
from state_runtime.catalog.schema import head_revision, upgrade
from state_runtime.catalog.settings import URL_ENV, CatalogTimeouts, catalog_url
from state_runtime.catalog.tables import FileState, RunKind, RunOutcome

__all__ = [
    "MIN_RETAINED_VERSIONS",
    "URL_ENV",
    "BatchCommit",
    "BatchMetrics",
    "Catalog",
    "CatalogTimeouts",
    "CommitEntry",
    "Deletion",
    "Explanation",
    "FileRecord",
    "FileState",
    "FileVerdict",
    "Lease",
    "MaintenanceRun",
    "RecordedBatchMetrics",
    "RetainedVersion",
    "RetentionPolicy",
    "RetryPolicy",
    "RunKind",
    "RunOutcome",
    "SnapshotCandidate",
    "StoreHealth",
    "StoreKey",
    "StoreRecord",
    "Verdict",
    "catalog_url",
    "head_revision",
    "upgrade",
]
