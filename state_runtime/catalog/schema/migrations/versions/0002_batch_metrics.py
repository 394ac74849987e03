"""Per-batch runtime metrics, each store's last maintenance run, an index of committed snapshots.

Revision ID: 0002_batch_metrics
Revises: 0001_initial
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002_batch_metrics"
down_revision: str | None = "0001_initial"
branch_labels: str | None = None
depends_on: str | None = None

SNAPSHOTS = "kind = 'snapshot' AND state = 'committed'"


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "batch_metrics",
        sa.Column("metrics_id", _id(), primary_key=True, autoincrement=True),
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("rows_in", sa.BigInteger(), nullable=False),
        sa.Column("keys_updated", sa.BigInteger(), nullable=False),
        sa.Column("state_rows", sa.BigInteger(), nullable=False),
        sa.Column("bytes_written", sa.BigInteger(), nullable=False),
        sa.Column("commit_ms", sa.Float(), nullable=False),
        sa.Column("cache_hits", sa.BigInteger(), nullable=False),
        sa.Column("cache_misses", sa.BigInteger(), nullable=False),
        sa.Column(
            "extra", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "checkpoint_root", "query_id", "batch_id", name="uq_batch_metrics_batch"
        ),
        sa.CheckConstraint("batch_id >= 0", name="ck_batch_metrics_batch"),
        sa.CheckConstraint(
            "rows_in >= 0 AND keys_updated >= 0 AND state_rows >= 0 AND bytes_written >= 0"
            " AND commit_ms >= 0 AND cache_hits >= 0 AND cache_misses >= 0",
            name="ck_batch_metrics_counts",
        ),
    )
    # SQLite cannot add a foreign key with ALTER TABLE through Alembic's generic path, but it
    # accepts a REFERENCES clause on a nullable new column; PostgreSQL gets a named constraint.
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE stores ADD COLUMN last_run_id INTEGER"
            " CONSTRAINT fk_stores_last_run_id REFERENCES maintenance_runs (run_id)"
        )
    else:
        op.add_column("stores", sa.Column("last_run_id", _id(), nullable=True))
        op.create_foreign_key(
            "fk_stores_last_run_id", "stores", "maintenance_runs", ["last_run_id"], ["run_id"]
        )
    op.create_index(
        "ix_checkpoint_files_committed_snapshots",
        "checkpoint_files",
        ["store_id", "version"],
        postgresql_where=sa.text(SNAPSHOTS),
        sqlite_where=sa.text(SNAPSHOTS),
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoint_files_committed_snapshots", table_name="checkpoint_files")
    with op.batch_alter_table("stores") as batch:
        batch.drop_column("last_run_id")
    op.drop_table("batch_metrics")
