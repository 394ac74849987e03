"""Operator views and functions for psql: now rendered, not migrated.

This revision once created ``state_needed_files``, ``state_file_verdicts`` and
``state_store_health`` by hand. Views are no longer part of the migrations: they are rendered
from the rules by ``state_runtime/catalog/schema/operator_views.py`` and recreated after every
upgrade (see ``migrations/env.py``). The revision stays so that the chain of revisions is unchanged.

Revision ID: 0003_operator_views
Revises: 0002_batch_metrics
Create Date: 2025-01-03
"""

from __future__ import annotations

revision = "0003_operator_views"
down_revision: str | None = "0002_batch_metrics"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """No tables change here."""


def downgrade() -> None:
    """No tables change here."""
