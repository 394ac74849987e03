"""Initial catalog: stores, checkpoint files, commit log, maintenance runs, deletions, leases.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_initial"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

LIVE = "state IN ('written', 'committed', 'orphan')"


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _hex(column: str, digits: int) -> str:
    """A CHECK expression: ``column`` holds exactly ``digits`` lowercase hex digits."""
    if op.get_bind().dialect.name == "postgresql":
        return f"{column} ~ '^[0-9a-f]{{{digits}}}$'"
    return f"length({column}) = {digits} AND {column} NOT GLOB '*[^0-9a-f]*'"


def upgrade() -> None:
    op.create_table(
        "maintenance_runs",
        sa.Column("run_id", _id(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("parameters", _json(), nullable=False),
        sa.Column("started_at", _ts(), nullable=False),
        sa.Column("ended_at", _ts(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("counts", _json(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('snapshot', 'cleanup', 'validate', 'reconcile')", name="ck_runs_kind"
        ),
        sa.CheckConstraint("outcome IN ('running', 'succeeded', 'failed')", name="ck_runs_outcome"),
        sa.CheckConstraint("(outcome = 'running') = (ended_at IS NULL)", name="ck_runs_ended"),
        sa.CheckConstraint("ended_at IS NULL OR ended_at >= started_at", name="ck_runs_order"),
        sa.CheckConstraint("owner <> ''", name="ck_runs_owner"),
    )
    op.create_index("ix_maintenance_runs_started_at", "maintenance_runs", ["started_at"])

    op.create_table(
        "stores",
        sa.Column("store_id", _id(), primary_key=True, autoincrement=True),
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("store_name", sa.String(128), nullable=False),
        sa.Column("key_schema", _json(), nullable=True),
        sa.Column("value_schema", _json(), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("latest_version", sa.BigInteger(), nullable=False),
        sa.Column("latest_checkpoint_id", sa.String(32), nullable=True),
        sa.Column("last_committed_at", _ts(), nullable=True),
        sa.UniqueConstraint(
            "checkpoint_root",
            "operator_id",
            "partition_id",
            "store_name",
            name="uq_stores_identity",
        ),
        sa.CheckConstraint("checkpoint_root <> ''", name="ck_stores_root"),
        sa.CheckConstraint("operator_id >= 0 AND partition_id >= 0", name="ck_stores_ids"),
        sa.CheckConstraint("length(store_name) BETWEEN 1 AND 128", name="ck_stores_name"),
        sa.CheckConstraint("latest_version >= 0", name="ck_stores_latest_version"),
        sa.CheckConstraint(
            "(latest_version = 0) = (latest_checkpoint_id IS NULL)", name="ck_stores_latest_id"
        ),
        sa.CheckConstraint(
            "latest_checkpoint_id IS NULL OR " + _hex("latest_checkpoint_id", 32),
            name="ck_stores_latest_id_hex",
        ),
    )

    op.create_table(
        "checkpoint_files",
        sa.Column("file_id", _id(), primary_key=True, autoincrement=True),
        sa.Column(
            "store_id",
            _id(),
            sa.ForeignKey("stores.store_id", name="fk_checkpoint_files_store_id"),
            nullable=False,
        ),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.String(32), nullable=False),
        sa.Column("base_checkpoint_id", sa.String(32), nullable=True),
        sa.Column("lineage", _json(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("file_rows", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("recorded_at", _ts(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_changed_at", _ts(), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column(
            "claimed_by_run",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_checkpoint_files_claimed_by_run"),
            nullable=True,
        ),
        sa.UniqueConstraint("store_id", "path", name="uq_checkpoint_files_path"),
        sa.UniqueConstraint(
            "store_id", "version", "checkpoint_id", "kind", name="uq_checkpoint_files_checkpoint"
        ),
        sa.CheckConstraint("kind IN ('delta', 'snapshot')", name="ck_files_kind"),
        sa.CheckConstraint(
            "state IN ('written', 'committed', 'orphan', 'deleting', 'deleted')",
            name="ck_files_state",
        ),
        sa.CheckConstraint("version >= 1", name="ck_files_version"),
        sa.CheckConstraint(
            "size_bytes >= 0 AND rows >= 0 AND file_rows >= 0", name="ck_files_counts"
        ),
        sa.CheckConstraint(_hex("checkpoint_id", 32), name="ck_files_id_hex"),
        sa.CheckConstraint(
            "base_checkpoint_id IS NULL OR " + _hex("base_checkpoint_id", 32),
            name="ck_files_base_hex",
        ),
        sa.CheckConstraint(_hex("checksum", 64), name="ck_files_checksum_hex"),
        sa.CheckConstraint(
            "kind = 'snapshot' OR (version = 1) = (base_checkpoint_id IS NULL)",
            name="ck_files_delta_base",
        ),
        sa.CheckConstraint(
            "state <> 'deleting' OR claimed_by_run IS NOT NULL", name="ck_files_claim"
        ),
    )
    op.create_index(
        "ix_checkpoint_files_live",
        "checkpoint_files",
        ["store_id", "version"],
        postgresql_where=sa.text(LIVE),
        sqlite_where=sa.text(LIVE),
    )
    op.create_index(
        "ix_checkpoint_files_deleting",
        "checkpoint_files",
        ["store_id"],
        postgresql_where=sa.text("state = 'deleting'"),
        sqlite_where=sa.text("state = 'deleting'"),
    )

    op.create_table(
        "commit_log",
        sa.Column("commit_id", _id(), primary_key=True, autoincrement=True),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "store_id",
            _id(),
            sa.ForeignKey("stores.store_id", name="fk_commit_log_store_id"),
            nullable=False,
        ),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.String(32), nullable=False),
        sa.Column(
            "file_id",
            _id(),
            sa.ForeignKey("checkpoint_files.file_id", name="fk_commit_log_file_id"),
            nullable=False,
        ),
        sa.Column("committed_at", _ts(), nullable=False),
        sa.UniqueConstraint("query_id", "batch_id", "store_id", name="uq_commit_log_batch_store"),
        sa.UniqueConstraint("store_id", "version", name="uq_commit_log_store_version"),
        sa.CheckConstraint("query_id <> ''", name="ck_commit_log_query"),
        sa.CheckConstraint("batch_id >= 0 AND version >= 1", name="ck_commit_log_numbers"),
        sa.CheckConstraint(_hex("checkpoint_id", 32), name="ck_commit_log_id_hex"),
    )
    op.create_index("ix_commit_log_file_id", "commit_log", ["file_id"])

    op.create_table(
        "deletion_ledger",
        sa.Column("deletion_id", _id(), primary_key=True, autoincrement=True),
        sa.Column(
            "file_id",
            _id(),
            sa.ForeignKey("checkpoint_files.file_id", name="fk_deletion_ledger_file_id"),
            nullable=False,
        ),
        sa.Column(
            "run_id",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_deletion_ledger_run_id"),
            nullable=False,
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("deleted_at", _ts(), nullable=False),
        sa.UniqueConstraint("file_id", name="uq_deletion_ledger_file_id"),
        sa.CheckConstraint("reason <> ''", name="ck_deletion_ledger_reason"),
    )
    op.create_index("ix_deletion_ledger_deleted_at", "deletion_ledger", ["deleted_at"])
    op.create_index("ix_deletion_ledger_run_id", "deletion_ledger", ["run_id"])

    op.create_table(
        "store_leases",
        sa.Column(
            "store_id",
            _id(),
            sa.ForeignKey("stores.store_id", name="fk_store_leases_store_id"),
            primary_key=True,
        ),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column(
            "run_id",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_store_leases_run_id"),
            nullable=True,
        ),
        sa.Column("acquired_at", _ts(), nullable=False),
        sa.Column("expires_at", _ts(), nullable=False),
        sa.CheckConstraint("expires_at > acquired_at", name="ck_store_leases_expiry"),
        sa.CheckConstraint(_hex("token", 32), name="ck_store_leases_token"),
        sa.CheckConstraint("owner <> ''", name="ck_store_leases_owner"),
    )


def downgrade() -> None:
    for table in (
        "store_leases",
        "deletion_ledger",
        "commit_log",
        "checkpoint_files",
        "stores",
        "maintenance_runs",
    ):
        op.drop_table(table)
