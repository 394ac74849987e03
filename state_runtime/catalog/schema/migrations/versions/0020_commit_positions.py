"""Commit positions: ``batch_metrics.xact_id`` and ``maintenance_runs.xact_id``, the
transaction that wrote each row (``pg_current_xact_id()`` on PostgreSQL, 0 on SQLite), with
an index on (``xact_id``, id) each: a reader's cursor that is exact when writers commit out of
id order (``state_runtime/catalog/sql/positions.py``). Existing rows get 0: they were all
committed before this migration (its ``ALTER TABLE`` waits for their writers), so they sort
before every new row, in id order, and a reader's old cursor (an id) is the position (0, id).
Then, on PostgreSQL, the column's default becomes the inserting transaction's id: code from
before this revision (a rolling upgrade) inserts rows without ``xact_id``, and a default of 0
would sort them before every cursor, never reported.

The reading views ``read_batch_metrics`` and ``read_maintenance_runs`` are recreated with the
others and show the new column; no grant changes (the writers' roles insert whole rows).

Revision ID: 0020_commit_positions
Revises: 0019_expired_versions
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_commit_positions"
down_revision: str | None = "0019_expired_versions"
branch_labels: str | None = None
depends_on: str | None = None

POSITIONS = {"batch_metrics": "metrics_id", "maintenance_runs": "run_id"}


def upgrade() -> None:
    for table, row in POSITIONS.items():
        op.add_column(
            table, sa.Column("xact_id", sa.BigInteger(), nullable=False, server_default="0")
        )
        if op.get_bind().dialect.name == "postgresql":
            op.alter_column(
                table, "xact_id", server_default=sa.text("(pg_current_xact_id()::text)::bigint")
            )
        op.create_index(f"ix_{table}_position", table, ["xact_id", row])


def downgrade() -> None:
    for table in reversed(POSITIONS):
        op.drop_index(f"ix_{table}_position", table_name=table)
        op.drop_column(table, "xact_id")
