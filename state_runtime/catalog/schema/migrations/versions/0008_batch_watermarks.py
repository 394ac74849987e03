"""Each batch's event-time watermark, fixed before the batch runs, and the largest event time
it saw, so that a replayed or restarted batch uses exactly the original watermark.

Revision ID: 0008_batch_watermarks
Revises: 0007_views_everywhere
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_batch_watermarks"
down_revision: str | None = "0007_views_everywhere"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "batch_watermarks",
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("query_id", sa.String(128), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("watermark_ms", sa.BigInteger(), nullable=False),
        sa.Column("max_event_ms", sa.BigInteger(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "checkpoint_root", "query_id", "batch_id", name="pk_batch_watermarks"
        ),
        sa.CheckConstraint("batch_id >= 0", name="ck_batch_watermarks_batch"),
    )


def downgrade() -> None:
    op.drop_table("batch_watermarks")
