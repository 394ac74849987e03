"""Status changes: each store's status as it changes (store, status, reason, changed_at), so
that a "since" in ``health``, ``explain``, Dagster and Airflow is the moment the status last
changed, not an estimate from the facts. Every maintenance run records the stores whose
status differs from their last recorded one as it closes; the health readers record before
they read (:mod:`state_runtime.catalog.sql.status_changes`).

The reading view ``read_store_status_changes`` is recreated with the others; the grants
applied at the end of every upgrade give maintenance its writes (and the runtime its
SELECT), as for every table.

Revision ID: 0016_status_changes
Revises: 0015_runtime_resolves_problems
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_status_changes"
down_revision: str | None = "0015_runtime_resolves_problems"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "store_status_changes",
        sa.Column(
            "change_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column(
            "store_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.ForeignKey("stores.store_id", name="fk_store_status_changes_store_id"),
            nullable=False,
        ),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('healthy', 'degraded', 'broken', 'unknown')",
            name="ck_store_status_changes_status",
        ),
    )
    op.create_index(
        "ix_store_status_changes_store", "store_status_changes", ["store_id", "change_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_store_status_changes_store", table_name="store_status_changes")
    op.drop_table("store_status_changes")
