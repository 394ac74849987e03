"""Schema history: every state schema by id, and each operator's schemas with the batch from
which they apply (state schema evolution, issue 24). Existing stores get their registered
schema as the first entry of their history when the runtime next starts.

Revision ID: 0009_schema_history
Revises: 0008_batch_watermarks
Create Date: 2026-11-26
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009_schema_history"
down_revision: str | None = "0008_batch_watermarks"
branch_labels: str | None = None
depends_on: str | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "state_schemas",
        sa.Column("schema_id", sa.String(32), nullable=False),
        sa.Column("parent_id", sa.String(32), nullable=True),
        sa.Column("key_schema", _json(), nullable=False),
        sa.Column("value_schema", _json(), nullable=False),
        sa.Column("change", _json(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("schema_id", name="pk_state_schemas"),
    )
    op.create_table(
        "operator_schemas",
        sa.Column("checkpoint_root", sa.Text(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=False),
        sa.Column("store_name", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("schema_id", sa.String(32), nullable=False),
        sa.Column("from_batch", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "checkpoint_root", "operator_id", "store_name", "seq", name="pk_operator_schemas"
        ),
        sa.ForeignKeyConstraint(
            ["schema_id"], ["state_schemas.schema_id"], name="fk_operator_schemas_schema_id"
        ),
        sa.CheckConstraint("seq >= 0 AND from_batch >= 0", name="ck_operator_schemas_order"),
    )


def downgrade() -> None:
    op.drop_table("operator_schemas")
    op.drop_table("state_schemas")
