"""Disk metrics: each batch's figures of state on the workers' local disk (resident bytes,
bytes on local disk, block-cache hits and misses, compaction bytes), recorded by the runtime
with the other batch metrics (docs/state-on-disk.md, "Operator view"). Existing batches get
0: they were recorded before these figures existed.

The reading view ``read_batch_metrics`` and ``state_batch_metrics`` are recreated with the
others and show the new columns; no grant changes (the runtime role already inserts and
updates ``batch_metrics``).

Revision ID: 0018_disk_metrics
Revises: 0017_intent_sequence
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_disk_metrics"
down_revision: str | None = "0017_intent_sequence"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = (
    "resident_bytes",
    "local_disk_bytes",
    "block_cache_hits",
    "block_cache_misses",
    "compaction_bytes",
)


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column(
            "batch_metrics",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"),
        )


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("batch_metrics", name)
