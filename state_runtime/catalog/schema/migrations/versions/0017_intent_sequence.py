"""Intent sequence: each batch intent gets the number of its place in the order the database
recorded the intents in, so that a commit from an older attempt of a batch (a zombie driver)
is refused once a newer attempt of that batch, or of a later batch of the query, has begun.
A clock cannot give that order: a host's clock stepped back makes a legitimate replay look
older than the attempt it replaces.

PostgreSQL: an identity column (``GENERATED ALWAYS``: no role inserts or sets its own
number). SQLite: the driver's insert takes the next number in the database's write lock.
Existing intents are numbered in the order the database holds them (SQLite: insertion order).

Revision ID: 0017_intent_sequence
Revises: 0016_status_changes
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_runtime.catalog.schema.check_constraints import edit_sqlite_table

revision = "0017_intent_sequence"
down_revision: str | None = "0016_status_changes"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.add_column(
            "batch_intents",
            sa.Column("sequence", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        )
    else:
        op.add_column("batch_intents", sa.Column("sequence", sa.BigInteger(), nullable=True))
        op.execute("UPDATE batch_intents SET sequence = rowid")
        edit_sqlite_table("batch_intents", "sequence BIGINT", "sequence BIGINT NOT NULL")
    op.create_index(
        "ix_batch_intents_batch", "batch_intents", ["checkpoint_root", "query_id", "batch_id"]
    )
    op.create_index("ux_batch_intents_sequence", "batch_intents", ["sequence"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_batch_intents_sequence", table_name="batch_intents")
    op.drop_index("ix_batch_intents_batch", table_name="batch_intents")
    op.drop_column("batch_intents", "sequence")
