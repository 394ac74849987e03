"""Operator layouts: each operator's partition count and routing rule over time, and
maintenance runs of kind 'repartition' (``statestore repartition``, issue 27).

Revision ID: 0013_operator_layouts
Revises: 0012_batch_intents
Create Date: 2026-11-26
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from state_runtime.catalog.schema.check_constraints import swap_runs_check

revision = "0013_operator_layouts"
down_revision: str | None = "0012_batch_intents"
branch_labels: str | None = None
depends_on: str | None = None

KINDS_BEFORE = "kind IN ('snapshot', 'cleanup', 'validate', 'reconcile', 'restore')"
KINDS = "kind IN ('snapshot', 'cleanup', 'validate', 'reconcile', 'restore', 'repartition')"


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "operator_layouts",
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=False),
        sa.Column("store_name", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.Column("num_partitions", sa.Integer(), nullable=False),
        sa.Column("routing", _json(), nullable=False),
        sa.Column("from_batch", sa.BigInteger(), nullable=False),
        sa.Column("from_version", sa.BigInteger(), nullable=False),
        sa.Column("run_id", _id(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "checkpoint_root", "operator_id", "store_name", "seq", name="pk_operator_layouts"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["maintenance_runs.run_id"], name="fk_operator_layouts_run_id"
        ),
        sa.CheckConstraint(
            "seq >= 0 AND num_partitions >= 1 AND from_batch >= 0 AND from_version >= 0",
            name="ck_operator_layouts_values",
        ),
    )
    swap_runs_check("ck_runs_kind", KINDS_BEFORE, KINDS)


def downgrade() -> None:
    op.execute(
        "UPDATE maintenance_runs SET kind = 'reconcile', error = 'repartition run: ' || "
        "COALESCE(error, '') WHERE kind = 'repartition'"
    )
    swap_runs_check("ck_runs_kind", KINDS, KINDS_BEFORE)
    op.drop_table("operator_layouts")
