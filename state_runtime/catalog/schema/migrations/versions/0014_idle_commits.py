"""Idle commits: a version that changed nothing is a commit of its parent's checkpoint, not a
file. Its commit-log entry names the checkpoint id it shares with its parent and no file
(``commit_log.file_id`` is NULL); the catalog holds no record of a path that never existed.

Catalogs written before held such a version as a 0-byte delta record ``<v>_<id>.delta`` whose
id is its own base id. The upgrade drops those records (and the ledger and repair entries that
name them), points their commit-log entries at no file, and resolves the problems recorded
against their paths (a "lost" file that never existed).

Revision ID: 0014_idle_commits
Revises: 0013_operator_layouts
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_runtime.catalog.schema.check_constraints import edit_sqlite_table

revision = "0014_idle_commits"
down_revision: str | None = "0013_operator_layouts"
branch_labels: str | None = None
depends_on: str | None = None

PHANTOMS = (
    "SELECT file_id FROM checkpoint_files "
    "WHERE kind = 'delta' AND checkpoint_id = base_checkpoint_id"
)
NOT_NULL = "file_id INTEGER NOT NULL,"
NULLABLE = "file_id INTEGER,"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("commit_log", "file_id", nullable=True)
    else:
        edit_sqlite_table("commit_log", NOT_NULL, NULLABLE)
    op.execute(f"UPDATE commit_log SET file_id = NULL WHERE file_id IN ({PHANTOMS})")
    op.execute(
        "UPDATE store_problems SET resolved_at = CURRENT_TIMESTAMP, resolution = "
        "'the path is the old record of a version that changed nothing: it never had a file "
        "(catalog revision 0014)' WHERE resolved_at IS NULL AND EXISTS (SELECT 1 FROM "
        "checkpoint_files f WHERE f.store_id = store_problems.store_id AND f.path = "
        "store_problems.path AND f.kind = 'delta' AND f.checkpoint_id = f.base_checkpoint_id)"
    )
    for table in ("deletion_ledger", "file_repairs"):
        op.execute(f"DELETE FROM {table} WHERE file_id IN ({PHANTOMS})")
    op.execute(f"DELETE FROM checkpoint_files WHERE file_id IN ({PHANTOMS})")


def downgrade() -> None:
    idle = (
        op.get_bind()
        .execute(sa.text("SELECT count(*) FROM commit_log WHERE file_id IS NULL"))
        .scalar_one()
    )
    if idle:
        raise RuntimeError(
            f"the catalog holds {idle} commit(s) of versions that changed nothing; revision "
            "0013 cannot represent them without a file record, so it is left at 0014"
        )
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("commit_log", "file_id", nullable=False)
    else:
        edit_sqlite_table("commit_log", NULLABLE, NOT_NULL)
