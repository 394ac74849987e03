"""The runtime resolves the problems a replay made moot: a commit that replaces the checkpoint
of a file a problem names (a loss the runtime recorded, then a replay that wrote the version
again) resolves that problem in its transaction, so ``health`` no longer calls the store
broken until the next validation.

No table changes. On PostgreSQL the runtime role needs UPDATE of ``store_problems``
(``resolved_at``, ``resolution`` only), held by the protocol guard to that one transition
(:mod:`state_runtime.catalog.schema.grants`): the grants ``grants --apply`` recorded are
applied again at the end of every upgrade to head (``migrations/env.py``), which gives an
existing catalog both. Code at this revision refuses a catalog below it, so no replay runs
against a catalog without the grant. A downgrade takes them back.

Revision ID: 0015_runtime_resolves_problems
Revises: 0014_idle_commits
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_runtime_resolves_problems"
down_revision: str | None = "0014_idle_commits"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Nothing in the tables: the grants applied at head carry the change (see above)."""


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS state_protocol_guard ON store_problems")
    runtime = bind.execute(
        sa.text("SELECT role_name FROM catalog_roles WHERE kind = 'runtime'")
    ).scalar()
    if runtime is not None:  # a checked identifier, recorded by ``grants --apply``
        op.execute(f'REVOKE UPDATE ON store_problems FROM "{runtime}"')
