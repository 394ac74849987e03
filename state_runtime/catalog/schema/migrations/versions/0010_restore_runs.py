"""Maintenance runs of kind 'restore' (``statestore restore``: a query returned to an earlier
batch).

Revision ID: 0010_restore_runs
Revises: 0009_schema_history
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

from state_runtime.catalog.schema.check_constraints import swap_runs_check

revision = "0010_restore_runs"
down_revision: str | None = "0009_schema_history"
branch_labels: str | None = None
depends_on: str | None = None

KINDS_BEFORE = "kind IN ('snapshot', 'cleanup', 'validate', 'reconcile')"
KINDS = "kind IN ('snapshot', 'cleanup', 'validate', 'reconcile', 'restore')"


def upgrade() -> None:
    swap_runs_check("ck_runs_kind", KINDS_BEFORE, KINDS)


def downgrade() -> None:
    op.execute(
        "UPDATE maintenance_runs SET kind = 'reconcile', error = 'restore run: ' || "
        "COALESCE(error, '') WHERE kind = 'restore'"
    )
    swap_runs_check("ck_runs_kind", KINDS, KINDS_BEFORE)
