"""Batch intents: the driver's record of each ``run_batch`` call, written before its tasks run,
so that the files of failed, speculative or zombie attempts are found without listing every
store (see docs/architecture.md, "Attempts the driver never hears of").

Revision ID: 0012_batch_intents
Revises: 0011_catalog_roles
Create Date: 2026-11-26
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012_batch_intents"
down_revision: str | None = "0011_catalog_roles"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "batch_intents",
        sa.Column("run", sa.String(32), primary_key=True),
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("operators", _json(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("suspects", _json(), nullable=True),
        sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("batch_id >= 0", name="ck_batch_intents_batch_id"),
    )
    op.create_index("ix_batch_intents_open", "batch_intents", ["swept_at", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_batch_intents_open", table_name="batch_intents")
    op.drop_table("batch_intents")
