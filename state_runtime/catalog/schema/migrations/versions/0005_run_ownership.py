"""Maintenance runs safe to start twice and recognisable when their process died.

A run carries the token its client generated (a retried ``start_run`` finds its own run
instead of creating a second one), the host and process that run it, and a heartbeat; a run
whose process is gone or whose heartbeat stopped is closed as ``abandoned`` by the next pass.

Revision ID: 0005_run_ownership
Revises: 0004_store_holders
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_runtime.catalog.schema.check_constraints import swap_runs_check

revision = "0005_run_ownership"
down_revision: str | None = "0004_store_holders"
branch_labels: str | None = None
depends_on: str | None = None

OUTCOMES_BEFORE = "outcome IN ('running', 'succeeded', 'failed')"
OUTCOMES = "outcome IN ('running', 'succeeded', 'failed', 'abandoned')"
RUNNING = "outcome = 'running'"


def _swap_outcome_check(before: str, after: str) -> None:
    swap_runs_check("ck_runs_outcome", before, after)


def upgrade() -> None:
    op.add_column("maintenance_runs", sa.Column("run_token", sa.String(32), nullable=True))
    op.add_column("maintenance_runs", sa.Column("host", sa.Text(), nullable=True))
    op.add_column("maintenance_runs", sa.Column("pid", sa.Integer(), nullable=True))
    op.add_column(
        "maintenance_runs", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True)
    )
    _swap_outcome_check(OUTCOMES_BEFORE, OUTCOMES)
    op.create_index("uq_maintenance_runs_token", "maintenance_runs", ["run_token"], unique=True)
    op.create_index(
        "ix_maintenance_runs_running",
        "maintenance_runs",
        ["run_id"],
        postgresql_where=sa.text(RUNNING),
        sqlite_where=sa.text(RUNNING),
    )


def downgrade() -> None:
    op.drop_index("ix_maintenance_runs_running", table_name="maintenance_runs")
    op.drop_index("uq_maintenance_runs_token", table_name="maintenance_runs")
    op.execute(
        "UPDATE maintenance_runs SET outcome = 'failed', error = 'abandoned: ' || "
        "COALESCE(error, '') WHERE outcome = 'abandoned'"
    )
    _swap_outcome_check(OUTCOMES, OUTCOMES_BEFORE)
    with op.batch_alter_table("maintenance_runs") as batch:
        for column in ("heartbeat_at", "pid", "host", "run_token"):
            batch.drop_column(column)
