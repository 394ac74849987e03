"""Verified snapshots, open validation problems, repairs and one store status.

- ``checkpoint_files.verification`` ('unverified', 'verified', 'failed'), ``verified_at`` and
  ``verification_note``: whether a file's bytes were checked against its record since it was
  written. Existing files start 'unverified' (nothing is lost: an unverified snapshot only
  supersedes nothing until validation verifies it).
- ``stores.first_validated_at`` / ``last_validated_at``: a store never validated is 'unknown'.
- ``store_problems``: what validation found wrong, open until a later validation no longer
  finds it or an operator resolves it. A store with an open problem is not cleaned.
- ``file_repairs``: each damaged snapshot rebuilt from its deltas: what was found, when the
  damaged copy was removed, and the record it replaced.
- The operators' views that follow these rules (verified snapshots only, damaged,
  unverified and held verdicts, the store status) are rendered from the rules by
  ``state_runtime/catalog/schema/operator_views.py`` after every upgrade, not written here.

Revision ID: 0006_verified_snapshots
Revises: 0005_run_ownership
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_verified_snapshots"
down_revision: str | None = "0005_run_ownership"
branch_labels: str | None = None
depends_on: str | None = None

VERIFIED_SNAPSHOTS = "kind = 'snapshot' AND state = 'committed' AND verification = 'verified'"


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    # A column constraint both PostgreSQL and SQLite accept in ADD COLUMN.
    op.execute(
        "ALTER TABLE checkpoint_files ADD COLUMN verification VARCHAR(16) DEFAULT 'unverified' "
        "NOT NULL CONSTRAINT ck_files_verification "
        "CHECK (verification IN ('unverified', 'verified', 'failed'))"
    )
    op.add_column("checkpoint_files", sa.Column("verified_at", _ts(), nullable=True))
    op.add_column("checkpoint_files", sa.Column("verification_note", sa.Text(), nullable=True))
    op.create_index(
        "ix_checkpoint_files_verified_snapshots",
        "checkpoint_files",
        ["store_id", "version"],
        postgresql_where=sa.text(VERIFIED_SNAPSHOTS),
        sqlite_where=sa.text(VERIFIED_SNAPSHOTS),
    )
    op.add_column("stores", sa.Column("first_validated_at", _ts(), nullable=True))
    op.add_column("stores", sa.Column("last_validated_at", _ts(), nullable=True))

    op.create_table(
        "store_problems",
        sa.Column("problem_id", _id(), primary_key=True, autoincrement=True),
        sa.Column(
            "store_id",
            _id(),
            sa.ForeignKey("stores.store_id", name="fk_store_problems_store_id"),
            nullable=False,
        ),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=True),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column(
            "run_id",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_store_problems_run_id"),
            nullable=True,
        ),
        sa.Column("detected_at", _ts(), nullable=False),
        sa.Column("resolved_at", _ts(), nullable=True),
        sa.Column(
            "resolved_by_run",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_store_problems_resolved_by_run"),
            nullable=True,
        ),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.CheckConstraint("problem <> ''", name="ck_store_problems_problem"),
        sa.CheckConstraint(
            "(resolved_at IS NULL) = (resolution IS NULL)", name="ck_store_problems_resolved"
        ),
    )
    op.create_index(
        "ix_store_problems_open",
        "store_problems",
        ["store_id"],
        postgresql_where=sa.text("resolved_at IS NULL"),
        sqlite_where=sa.text("resolved_at IS NULL"),
    )

    op.create_table(
        "file_repairs",
        sa.Column("repair_id", _id(), primary_key=True, autoincrement=True),
        sa.Column(
            "file_id",
            _id(),
            sa.ForeignKey("checkpoint_files.file_id", name="fk_file_repairs_file_id"),
            nullable=False,
        ),
        sa.Column(
            "run_id",
            _id(),
            sa.ForeignKey("maintenance_runs.run_id", name="fk_file_repairs_run_id"),
            nullable=False,
        ),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column("damaged_size", sa.BigInteger(), nullable=True),
        sa.Column("damaged_sha256", sa.String(64), nullable=True),
        sa.Column("old_checksum", sa.String(64), nullable=False),
        sa.Column("old_size", sa.BigInteger(), nullable=False),
        sa.Column("started_at", _ts(), nullable=False),
        sa.Column("removed_at", _ts(), nullable=True),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.CheckConstraint("problem <> ''", name="ck_file_repairs_problem"),
    )
    op.create_index("ix_file_repairs_file_id", "file_repairs", ["file_id"])


def downgrade() -> None:
    op.drop_index("ix_file_repairs_file_id", table_name="file_repairs")
    op.drop_table("file_repairs")
    op.drop_index("ix_store_problems_open", table_name="store_problems")
    op.drop_table("store_problems")
    op.drop_index("ix_checkpoint_files_verified_snapshots", table_name="checkpoint_files")
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35.
    for table, column in (
        ("stores", "last_validated_at"),
        ("stores", "first_validated_at"),
        ("checkpoint_files", "verification_note"),
        ("checkpoint_files", "verified_at"),
        ("checkpoint_files", "verification"),
    ):
        op.drop_column(table, column)
