"""The coordinator's records: which Spark Python worker last committed each store.

Revision ID: 0004_store_holders
Revises: 0003_operator_views
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_store_holders"
down_revision: str | None = "0003_operator_views"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "store_holders",
        sa.Column(
            "store_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.ForeignKey("stores.store_id", name="fk_store_holders_store_id"),
            primary_key=True,
        ),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("version >= 1", name="ck_store_holders_version"),
    )


def downgrade() -> None:
    op.drop_table("store_holders")
