"""Expired versions: each store's ``expired_through``, the newest version that cleanup left
unable to load (it deleted a committed file, needed by no retained version, that the version
loaded through; older versions expire with it). No version at or below it counts as retained
again, so a restore that moves the latest
version back next to expired ones does not make them look lost (``state_runtime/retention.py``).
A restore lowers it below its target, which it checked loads. The reading view
``read_stores`` is recreated with the others.

Revision ID: 0019_expired_versions
Revises: 0018_disk_metrics
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_expired_versions"
down_revision: str | None = "0018_disk_metrics"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "stores",
        sa.Column("expired_through", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("stores", "expired_through")
