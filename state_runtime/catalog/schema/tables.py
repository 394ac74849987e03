"""The catalog's tables as SQLAlchemy Core objects, for building queries.

The Alembic migrations in ``migrations/versions`` are the one source of truth for the schema:
they create the tables, constraints, indexes and views. This module describes the head
revision's columns, keys and indexes so that queries are typed; ``tests/catalog/test_migrations.py``
fails if it drifts from what the migrations build. CHECK constraints live only in the migrations.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from state_runtime.catalog.records import DISK_FIGURES
from state_runtime.catalog.schema import predicates

# A run's kinds and outcomes live in runs.py (predicates names them); re-exported here.
from state_runtime.catalog.schema.runs import RunKind as RunKind
from state_runtime.catalog.schema.runs import RunOutcome as RunOutcome
from state_runtime.catalog.sql.positions import WritingTransaction
from state_runtime.catalog.sql.roots import folder_of, resolved_root, stored_root

# The file life cycle and verification states belong to the retention rule; re-exported here.
from state_runtime.retention import LIVE_STATES as LIVE_STATES
from state_runtime.retention import FileState as FileState
from state_runtime.retention import Verification as Verification


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored in UTC and read back as an aware UTC datetime on every dialect.

    Naive datetimes are taken to be UTC. SQLite stores naive ISO text with microseconds, so
    comparisons stay correct as text comparisons.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class CheckpointRoot(sa.TypeDecorator[str]):
    """A checkpoint root: stored relative to a SQLite catalog file's folder when inside it
    (see :mod:`state_runtime.catalog.sql.roots`), always read back as its URI."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else stored_root(value, folder_of(dialect))

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else resolved_root(value, folder_of(dialect))


def _id_type() -> sa.types.TypeEngine[int]:
    # SQLite only auto-increments an INTEGER PRIMARY KEY.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json_type() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


metadata = sa.MetaData()
_LIVE = predicates.render(predicates.is_live)
_VERIFIED_SNAPSHOTS = predicates.render(predicates.is_verified_snapshot_by_row)

stores = sa.Table(
    "stores",
    metadata,
    sa.Column("store_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column("checkpoint_root", CheckpointRoot(), nullable=False),
    sa.Column("operator_id", sa.Integer(), nullable=False),
    sa.Column("partition_id", sa.Integer(), nullable=False),
    sa.Column("store_name", sa.String(128), nullable=False),
    sa.Column("key_schema", _json_type(), nullable=True),
    sa.Column("value_schema", _json_type(), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("latest_version", sa.BigInteger(), nullable=False),
    sa.Column("latest_checkpoint_id", sa.String(32), nullable=True),
    sa.Column("last_committed_at", UtcDateTime(), nullable=True),
    sa.Column("first_validated_at", UtcDateTime(), nullable=True),
    sa.Column("last_validated_at", UtcDateTime(), nullable=True),
    sa.Column(
        "last_run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_stores_last_run_id"),
        nullable=True,
    ),
    sa.Column("expired_through", sa.BigInteger(), nullable=False, server_default="0"),
    sa.UniqueConstraint(
        "checkpoint_root", "operator_id", "partition_id", "store_name", name="uq_stores_identity"
    ),
)

maintenance_runs = sa.Table(
    "maintenance_runs",
    metadata,
    sa.Column("run_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("owner", sa.Text(), nullable=False),
    sa.Column("parameters", _json_type(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("ended_at", UtcDateTime(), nullable=True),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("counts", _json_type(), nullable=False),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("run_token", sa.String(32), nullable=True),
    sa.Column("host", sa.Text(), nullable=True),
    sa.Column("pid", sa.Integer(), nullable=True),
    sa.Column("heartbeat_at", UtcDateTime(), nullable=True),
    sa.Column("xact_id", sa.BigInteger(), nullable=False, server_default=WritingTransaction()),
    sa.Index("ix_maintenance_runs_started_at", "started_at"),
    sa.Index("ix_maintenance_runs_position", "xact_id", "run_id"),
    sa.Index("uq_maintenance_runs_token", "run_token", unique=True),
    sa.Index(
        "ix_maintenance_runs_running",
        "run_id",
        postgresql_where=sa.text("outcome = 'running'"),
        sqlite_where=sa.text("outcome = 'running'"),
    ),
)

checkpoint_files = sa.Table(
    "checkpoint_files",
    metadata,
    sa.Column("file_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_checkpoint_files_store_id"),
        nullable=False,
    ),
    sa.Column("path", sa.Text(), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("checkpoint_id", sa.String(32), nullable=False),
    sa.Column("base_checkpoint_id", sa.String(32), nullable=True),
    sa.Column("lineage", _json_type(), nullable=False),
    sa.Column("size_bytes", sa.BigInteger(), nullable=False),
    sa.Column("rows", sa.BigInteger(), nullable=False),
    sa.Column("file_rows", sa.BigInteger(), nullable=False),
    sa.Column("checksum", sa.String(64), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("recorded_at", UtcDateTime(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("state_changed_at", UtcDateTime(), nullable=False),
    sa.Column("state_reason", sa.Text(), nullable=True),
    sa.Column(
        "claimed_by_run",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_checkpoint_files_claimed_by_run"),
        nullable=True,
    ),
    sa.Column(
        "verification",
        sa.String(16),
        nullable=False,
        server_default=Verification.UNVERIFIED.value,
    ),
    sa.Column("verified_at", UtcDateTime(), nullable=True),
    sa.Column("verification_note", sa.Text(), nullable=True),
    sa.UniqueConstraint("store_id", "path", name="uq_checkpoint_files_path"),
    sa.UniqueConstraint(
        "store_id", "version", "checkpoint_id", "kind", name="uq_checkpoint_files_checkpoint"
    ),
    sa.Index(
        "ix_checkpoint_files_live",
        "store_id",
        "version",
        postgresql_where=sa.text(_LIVE),
        sqlite_where=sa.text(_LIVE),
    ),
    sa.Index(
        "ix_checkpoint_files_deleting",
        "store_id",
        postgresql_where=sa.text("state = 'deleting'"),
        sqlite_where=sa.text("state = 'deleting'"),
    ),
    sa.Index(
        "ix_checkpoint_files_committed_snapshots",
        "store_id",
        "version",
        postgresql_where=sa.text("kind = 'snapshot' AND state = 'committed'"),
        sqlite_where=sa.text("kind = 'snapshot' AND state = 'committed'"),
    ),
    sa.Index(
        "ix_checkpoint_files_verified_snapshots",
        "store_id",
        "version",
        postgresql_where=sa.text(_VERIFIED_SNAPSHOTS),
        sqlite_where=sa.text(_VERIFIED_SNAPSHOTS),
    ),
)

commit_log = sa.Table(
    "commit_log",
    metadata,
    sa.Column("commit_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column("query_id", sa.String(128), nullable=False),
    sa.Column("batch_id", sa.BigInteger(), nullable=False),
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_commit_log_store_id"),
        nullable=False,
    ),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("checkpoint_id", sa.String(32), nullable=False),
    sa.Column(
        "file_id",
        _id_type(),
        sa.ForeignKey("checkpoint_files.file_id", name="fk_commit_log_file_id"),
        nullable=True,  # NULL: the version changed nothing; it commits its parent's checkpoint
    ),
    sa.Column("committed_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("query_id", "batch_id", "store_id", name="uq_commit_log_batch_store"),
    sa.UniqueConstraint("store_id", "version", name="uq_commit_log_store_version"),
    sa.Index("ix_commit_log_file_id", "file_id"),
)

deletion_ledger = sa.Table(
    "deletion_ledger",
    metadata,
    sa.Column("deletion_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column(
        "file_id",
        _id_type(),
        sa.ForeignKey("checkpoint_files.file_id", name="fk_deletion_ledger_file_id"),
        nullable=False,
    ),
    sa.Column(
        "run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_deletion_ledger_run_id"),
        nullable=False,
    ),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("deleted_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("file_id", name="uq_deletion_ledger_file_id"),
    sa.Index("ix_deletion_ledger_deleted_at", "deleted_at"),
    sa.Index("ix_deletion_ledger_run_id", "run_id"),
)

store_leases = sa.Table(
    "store_leases",
    metadata,
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_store_leases_store_id"),
        primary_key=True,
    ),
    sa.Column("token", sa.String(32), nullable=False),
    sa.Column("owner", sa.Text(), nullable=False),
    sa.Column(
        "run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_store_leases_run_id"),
        nullable=True,
    ),
    sa.Column("acquired_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
)

batch_metrics = sa.Table(
    "batch_metrics",
    metadata,
    sa.Column("metrics_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column("checkpoint_root", CheckpointRoot(), nullable=False),
    sa.Column("query_id", sa.String(128), nullable=False),
    sa.Column("batch_id", sa.BigInteger(), nullable=False),
    sa.Column("rows_in", sa.BigInteger(), nullable=False),
    sa.Column("keys_updated", sa.BigInteger(), nullable=False),
    sa.Column("state_rows", sa.BigInteger(), nullable=False),
    sa.Column("bytes_written", sa.BigInteger(), nullable=False),
    sa.Column("commit_ms", sa.Float(), nullable=False),
    sa.Column("cache_hits", sa.BigInteger(), nullable=False),
    sa.Column("cache_misses", sa.BigInteger(), nullable=False),
    sa.Column("extra", _json_type(), nullable=False),
    sa.Column("recorded_at", UtcDateTime(), nullable=False),
    *(
        sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")
        for name in DISK_FIGURES
    ),
    sa.Column("xact_id", sa.BigInteger(), nullable=False, server_default=WritingTransaction()),
    sa.UniqueConstraint("checkpoint_root", "query_id", "batch_id", name="uq_batch_metrics_batch"),
    sa.Index("ix_batch_metrics_position", "xact_id", "metrics_id"),
)

store_holders = sa.Table(
    "store_holders",
    metadata,
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_store_holders_store_id"),
        primary_key=True,
    ),
    sa.Column("worker", sa.Text(), nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("checkpoint_id", sa.String(32), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
)

batch_intents = sa.Table(
    "batch_intents",
    metadata,
    sa.Column("run", sa.String(32), primary_key=True),
    sa.Column("checkpoint_root", CheckpointRoot(), nullable=False),
    sa.Column("query_id", sa.String(128), nullable=False),
    sa.Column("batch_id", sa.BigInteger(), nullable=False),
    sa.Column("operators", _json_type(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("committed_at", UtcDateTime(), nullable=True),
    sa.Column("suspects", _json_type(), nullable=True),
    sa.Column("swept_at", UtcDateTime(), nullable=True),
    sa.Column("sequence", sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Index("ix_batch_intents_open", "swept_at", "started_at"),
    sa.Index("ix_batch_intents_batch", "checkpoint_root", "query_id", "batch_id"),
    sa.Index("ux_batch_intents_sequence", "sequence", unique=True),
)
"""``sequence``: the order the intents were recorded in, by the database (an identity on
PostgreSQL, the next number in the write's own lock on SQLite), never by a clock: a commit
from an intent older than the newest intent of its batch is refused (``sql/commits.py``)."""

store_problems = sa.Table(
    "store_problems",
    metadata,
    sa.Column("problem_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_store_problems_store_id"),
        nullable=False,
    ),
    sa.Column("path", sa.Text(), nullable=True),
    sa.Column("version", sa.BigInteger(), nullable=True),
    sa.Column("problem", sa.Text(), nullable=False),
    sa.Column(
        "run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_store_problems_run_id"),
        nullable=True,
    ),
    sa.Column("detected_at", UtcDateTime(), nullable=False),
    sa.Column("resolved_at", UtcDateTime(), nullable=True),
    sa.Column(
        "resolved_by_run",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_store_problems_resolved_by_run"),
        nullable=True,
    ),
    sa.Column("resolution", sa.Text(), nullable=True),
    sa.Index(
        "ix_store_problems_open",
        "store_id",
        postgresql_where=sa.text("resolved_at IS NULL"),
        sqlite_where=sa.text("resolved_at IS NULL"),
    ),
)

file_repairs = sa.Table(
    "file_repairs",
    metadata,
    sa.Column("repair_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column(
        "file_id",
        _id_type(),
        sa.ForeignKey("checkpoint_files.file_id", name="fk_file_repairs_file_id"),
        nullable=False,
    ),
    sa.Column(
        "run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_file_repairs_run_id"),
        nullable=False,
    ),
    sa.Column("problem", sa.Text(), nullable=False),
    sa.Column("damaged_size", sa.BigInteger(), nullable=True),
    sa.Column("damaged_sha256", sa.String(64), nullable=True),
    sa.Column("old_checksum", sa.String(64), nullable=False),
    sa.Column("old_size", sa.BigInteger(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("removed_at", UtcDateTime(), nullable=True),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    sa.Index("ix_file_repairs_file_id", "file_id"),
)

batch_watermarks = sa.Table(
    "batch_watermarks",
    metadata,
    sa.Column("checkpoint_root", CheckpointRoot(), primary_key=True),
    sa.Column("query_id", sa.String(128), primary_key=True),
    sa.Column("batch_id", sa.BigInteger(), primary_key=True),
    sa.Column("watermark_ms", sa.BigInteger(), nullable=False),
    sa.Column("max_event_ms", sa.BigInteger(), nullable=True),
    sa.Column("recorded_at", UtcDateTime(), nullable=False),
)

state_schemas = sa.Table(
    "state_schemas",
    metadata,
    sa.Column("schema_id", sa.String(32), primary_key=True),
    sa.Column("parent_id", sa.String(32), nullable=True),
    sa.Column("key_schema", _json_type(), nullable=False),
    sa.Column("value_schema", _json_type(), nullable=False),
    sa.Column("change", _json_type(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

operator_schemas = sa.Table(
    "operator_schemas",
    metadata,
    sa.Column("checkpoint_root", CheckpointRoot(), primary_key=True),
    sa.Column("operator_id", sa.Integer(), primary_key=True),
    sa.Column("store_name", sa.String(128), primary_key=True),
    sa.Column("seq", sa.Integer(), primary_key=True),
    sa.Column(
        "schema_id",
        sa.String(32),
        sa.ForeignKey("state_schemas.schema_id", name="fk_operator_schemas_schema_id"),
        nullable=False,
    ),
    sa.Column("from_batch", sa.BigInteger(), nullable=False),
    sa.Column("recorded_at", UtcDateTime(), nullable=False),
)

operator_layouts = sa.Table(
    "operator_layouts",
    metadata,
    sa.Column("checkpoint_root", CheckpointRoot(), primary_key=True),
    sa.Column("operator_id", sa.Integer(), primary_key=True),
    sa.Column("store_name", sa.String(128), primary_key=True),
    sa.Column("seq", sa.Integer(), primary_key=True),
    sa.Column("query_id", sa.String(128), nullable=False),
    sa.Column("num_partitions", sa.Integer(), nullable=False),
    sa.Column("routing", _json_type(), nullable=False),
    sa.Column("from_batch", sa.BigInteger(), nullable=False),
    sa.Column("from_version", sa.BigInteger(), nullable=False),
    sa.Column(
        "run_id",
        _id_type(),
        sa.ForeignKey("maintenance_runs.run_id", name="fk_operator_layouts_run_id"),
        nullable=True,
    ),
    sa.Column("recorded_at", UtcDateTime(), nullable=False),
)

store_status_changes = sa.Table(
    "store_status_changes",
    metadata,
    sa.Column("change_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column(
        "store_id",
        _id_type(),
        sa.ForeignKey("stores.store_id", name="fk_store_status_changes_store_id"),
        nullable=False,
    ),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("changed_at", UtcDateTime(), nullable=False),
    sa.Index("ix_store_status_changes_store", "store_id", "change_id"),
)
"""Each store's status changes, newest last: what a "since" reads
(``state_runtime/catalog/sql/status_changes.py`` records them)."""

root_queries = sa.Table(
    "root_queries",
    metadata,
    sa.Column("pair_id", _id_type(), primary_key=True, autoincrement=True),
    sa.Column("checkpoint_root", CheckpointRoot(), nullable=False),
    sa.Column("query_id", sa.String(128), nullable=False),
    sa.UniqueConstraint("checkpoint_root", "query_id", name="uq_root_queries_pair"),
)
"""Each (root, query) pair the commit log ever held, added by a trigger on ``commit_log``
(migration 0021: every writer of the commit log adds its pairs, whatever its code), moved
with its root by ``relocate_root``. What the stores' names follow
(``state_runtime/maintenance/store_names.py``): its count and newest id change exactly when
a query first commits below a root, whatever its batch numbers. No statement deletes a pair
(a rewind or a layout switch removes commit entries, never the table's rows), so the newest
id never falls back and SQLite's rowid, reused only after the
largest is deleted, needs no ``AUTOINCREMENT``."""

catalog_roles = sa.Table(
    "catalog_roles",
    metadata,
    sa.Column("kind", sa.String(16), primary_key=True),
    sa.Column("role_name", sa.String(63), nullable=False),
)
"""The role names ``grants --apply`` granted (PostgreSQL): each upgrade grants to them again."""
