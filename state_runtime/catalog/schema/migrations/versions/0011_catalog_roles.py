"""The catalog's role names (PostgreSQL), recorded by ``grants --apply``, so that every later
upgrade grants the tables and views it creates to those roles (see
:mod:`state_runtime.catalog.schema.grants`).

Revision ID: 0011_catalog_roles
Revises: 0010_restore_runs
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_catalog_roles"
down_revision: str | None = "0010_restore_runs"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "catalog_roles",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("role_name", sa.String(63), nullable=False),
        sa.CheckConstraint(
            "kind IN ('owner', 'runtime', 'maintenance', 'reader')", name="ck_roles_kind"
        ),
    )


def downgrade() -> None:
    op.drop_table("catalog_roles")
