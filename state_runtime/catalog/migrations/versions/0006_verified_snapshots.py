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
- PostgreSQL: the operator functions and view of 0003 are replaced by ones that follow the
  rule of ``state_runtime/retention.py`` (verified snapshots only, damaged/unverified/held
  verdicts) and the status rule of ``state_runtime/status.py``; a test checks that
  they agree with the Python rules.

Revision ID: 0006_verified_snapshots
Revises: 0005_run_ownership
Create Date: 2026-11-23
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import op
from alembic.util.pyfiles import load_python_file

revision = "0006_verified_snapshots"
down_revision: str | None = "0005_run_ownership"
branch_labels: str | None = None
depends_on: str | None = None

LIVE = "('written', 'committed', 'orphan')"
VERIFIED_SNAPSHOTS = "kind = 'snapshot' AND state = 'committed' AND verification = 'verified'"


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


RETAINED = """
CREATE FUNCTION state_retained_versions(retain_versions integer)
RETURNS TABLE (store_id bigint, retained_version bigint, base_version bigint)
LANGUAGE sql STABLE AS $$
    -- Commits keep each store's committed versions one linear, gapless chain, so the retained
    -- versions are latest - k; version r loads from the newest committed, verified snapshot at
    -- or below r (version s; 0: none) and the committed deltas s+1..r.
    SELECT s.store_id, s.latest_version - k,
           coalesce((SELECT max(snap.version) FROM checkpoint_files snap
                     WHERE snap.store_id = s.store_id AND snap.kind = 'snapshot'
                       AND snap.state = 'committed' AND snap.verification = 'verified'
                       AND snap.version <= s.latest_version - k), 0)
    FROM stores s
    CROSS JOIN generate_series(0, greatest(retain_versions, 2) - 1) AS k
    WHERE s.latest_version - k >= 1
$$;
COMMENT ON FUNCTION state_retained_versions(integer) IS
  'The last N committed versions (N >= 2) of each store and the verified snapshot each loads from.';
"""

NEEDED_FILES = """
CREATE FUNCTION state_needed_files(retain_versions integer)
RETURNS TABLE (file_id bigint, store_id bigint, retained_version bigint)
LANGUAGE sql STABLE AS $$
    SELECT f.file_id, f.store_id, r.retained_version
    FROM state_retained_versions(retain_versions) r
    JOIN checkpoint_files f
      ON f.store_id = r.store_id AND f.version = r.base_version
     AND f.kind = 'snapshot' AND f.state = 'committed' AND f.verification = 'verified'
    UNION ALL
    SELECT f.file_id, f.store_id, r.retained_version
    FROM state_retained_versions(retain_versions) r
    JOIN checkpoint_files f
      ON f.store_id = r.store_id AND f.version > r.base_version
     AND f.version <= r.retained_version AND f.kind = 'delta' AND f.state = 'committed'
$$;
COMMENT ON FUNCTION state_needed_files(integer) IS
  'Files each of the last N committed versions (N >= 2) loads through (verified snapshots only).';
"""

FILE_VERDICTS = """
CREATE FUNCTION state_file_verdicts(
    retain_versions integer, retention interval, orphan_grace interval)
RETURNS TABLE (
    file_id bigint, store_id bigint, checkpoint_root text, operator_id integer,
    partition_id integer, store_name varchar, path text, kind varchar, version bigint,
    checkpoint_id varchar, state varchar, verification varchar, size_bytes bigint,
    created_at timestamptz, needed_from bigint, needed_to bigint, verdict text, reason text)
LANGUAGE sql STABLE AS $$
    WITH needed AS (
        SELECT n.file_id, min(n.retained_version) AS needed_from,
               max(n.retained_version) AS needed_to
        FROM state_needed_files(retain_versions) n
        GROUP BY n.file_id
    ), floors AS (
        SELECT r.store_id, min(r.base_version) AS floor_version
        FROM state_retained_versions(retain_versions) r
        GROUP BY r.store_id
    ), held AS (
        SELECT DISTINCT p.store_id FROM store_problems p WHERE p.resolved_at IS NULL
    ), judged AS (
        SELECT f.*, n.needed_from, n.needed_to,
               CASE
                 WHEN n.file_id IS NOT NULL THEN 'needed'
                 WHEN f.state = 'deleting' THEN 'deleting'
                 WHEN f.state = 'committed' AND f.kind = 'snapshot'
                      AND f.verification = 'failed' AND f.version >= fl.floor_version
                   THEN 'damaged'
                 WHEN f.state = 'committed' AND f.kind = 'snapshot'
                      AND f.verification = 'unverified' AND f.version >= fl.floor_version
                   THEN 'unverified'
                 WHEN f.state = 'committed' AND h.store_id IS NOT NULL THEN 'held'
                 WHEN f.state = 'committed' AND f.created_at <= now() - retention
                   THEN 'deletable_superseded'
                 WHEN f.state = 'committed' THEN 'within_window'
                 WHEN f.state = 'orphan'
                      AND f.created_at <= now() - greatest(retention, orphan_grace)
                   THEN 'deletable_orphan'
                 WHEN f.state = 'orphan' THEN 'orphan_in_grace'
                 WHEN f.created_at <= now() - greatest(retention, orphan_grace)
                   THEN 'deletable_uncommitted'
                 ELSE 'in_flight'
               END AS verdict
        FROM checkpoint_files f
        LEFT JOIN needed n ON n.file_id = f.file_id
        LEFT JOIN floors fl ON fl.store_id = f.store_id
        LEFT JOIN held h ON h.store_id = f.store_id
        WHERE f.state IN ('written', 'committed', 'orphan', 'deleting')
    )
    SELECT j.file_id, j.store_id, s.checkpoint_root, s.operator_id, s.partition_id,
           s.store_name, j.path, j.kind, j.version, j.checkpoint_id, j.state, j.verification,
           j.size_bytes, j.created_at, j.needed_from, j.needed_to, j.verdict,
           CASE j.verdict
             WHEN 'needed' THEN
               'needed to load retained ' || CASE WHEN j.needed_from = j.needed_to
                 THEN 'version ' || j.needed_from
                 ELSE 'versions ' || j.needed_from || '..' || j.needed_to END
             WHEN 'deleting' THEN 'claimed for deletion by cleanup run ' || j.claimed_by_run
             WHEN 'damaged' THEN
               'damaged snapshot (' || coalesce(j.verification_note, 'verification failed')
               || '): it supersedes nothing, its deltas stay; kept until a repair replaces it'
             WHEN 'unverified' THEN
               'snapshot not verified since it was written: it supersedes nothing, its deltas '
               || 'stay; kept until validation or the snapshot pass verifies it'
             WHEN 'held' THEN
               'held: the store has an open validation failure; nothing it committed is '
               || 'deleted until a validation passes or an operator resolves the failure'
             WHEN 'within_window' THEN
               'committed and no longer needed by the last ' || greatest(retain_versions, 2)
               || ' committed versions, but younger than the retention window'
             WHEN 'deletable_superseded' THEN
               'superseded: not needed by the last ' || greatest(retain_versions, 2)
               || ' committed versions and older than the retention window'
             WHEN 'orphan_in_grace' THEN
               'orphan (' || coalesce(j.state_reason, '?') || '), younger than the grace period'
             WHEN 'deletable_orphan' THEN
               'orphan (' || coalesce(j.state_reason, '?') || '), older than the grace period'
             WHEN 'deletable_uncommitted' THEN
               'never committed: no commit names it and it is older than the grace period'
             ELSE 'written but not committed, younger than the grace period: '
                  || 'it may belong to a batch in flight'
           END
    FROM judged j
    JOIN stores s ON s.store_id = j.store_id
$$;
COMMENT ON FUNCTION state_file_verdicts(integer, interval, interval) IS
  'Every live or claimed file: why it is kept or why cleanup may delete it.';
"""

STORE_FACTS = f"""
CREATE VIEW state_store_facts AS
WITH live AS (
    SELECT store_id,
           count(*) AS live_files,
           sum(size_bytes) AS live_bytes,
           count(*) FILTER (WHERE state = 'orphan') AS orphan_files,
           coalesce(sum(size_bytes) FILTER (WHERE state = 'orphan'), 0) AS orphan_bytes,
           min(state_changed_at) FILTER (WHERE state = 'orphan') AS oldest_orphan_at
    FROM checkpoint_files
    WHERE state IN {LIVE}
    GROUP BY store_id
), snapshots AS (
    SELECT store_id, max(version) AS version
    FROM checkpoint_files
    WHERE {VERIFIED_SNAPSHOTS}
    GROUP BY store_id
), problems AS (
    SELECT store_id, count(*) FILTER (WHERE resolved_at IS NULL) AS open_problems,
           min(detected_at) FILTER (WHERE resolved_at IS NULL) AS problems_since,
           max(resolved_at) AS last_resolved_at
    FROM store_problems
    GROUP BY store_id
), first_problem AS (
    SELECT DISTINCT ON (store_id) store_id,
           problem || coalesce(' (file ' || path || ')', '') AS text
    FROM store_problems
    WHERE resolved_at IS NULL
    ORDER BY store_id, detected_at, problem_id
)
SELECT s.store_id, s.created_at, s.latest_version,
       coalesce(snapshots.version, 0) AS last_snapshot_version,
       s.latest_version - coalesce(snapshots.version, 0) AS deltas_since_snapshot,
       chain.committed_at AS chain_since,
       coalesce(live.orphan_files, 0) AS orphan_files, live.oldest_orphan_at,
       coalesce(problems.open_problems, 0) AS open_problems, problems.problems_since,
       first_problem.text AS first_problem, problems.last_resolved_at,
       s.first_validated_at, s.last_validated_at
FROM stores s
LEFT JOIN snapshots ON snapshots.store_id = s.store_id
LEFT JOIN commit_log chain
  ON chain.store_id = s.store_id AND chain.version = coalesce(snapshots.version, 0) + 1
LEFT JOIN live ON live.store_id = s.store_id
LEFT JOIN problems ON problems.store_id = s.store_id
LEFT JOIN first_problem ON first_problem.store_id = s.store_id;
COMMENT ON VIEW state_store_facts IS
  'The catalog facts each store''s status is derived from (see state_store_status).';
"""

STORE_STATUS = """
CREATE FUNCTION state_store_status(lag_warn_deltas integer, orphan_warn_files integer)
RETURNS TABLE (store_id bigint, status text, status_reason text, status_since timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT f.store_id,
           CASE WHEN f.open_problems > 0 THEN 'broken'
                WHEN f.first_validated_at IS NULL THEN 'unknown'
                WHEN lagging OR orphaned THEN 'degraded'
                ELSE 'healthy' END,
           CASE WHEN f.open_problems = 1 THEN f.first_problem
                WHEN f.open_problems > 1 THEN
                  f.open_problems || ' open problems; first: ' || f.first_problem
                WHEN f.first_validated_at IS NULL THEN 'never validated'
                WHEN lagging OR orphaned THEN concat_ws('; ',
                  CASE WHEN lagging THEN f.deltas_since_snapshot
                    || ' deltas since the last verified snapshot (warn at '
                    || lag_warn_deltas || ')' END,
                  CASE WHEN orphaned THEN f.orphan_files || ' orphan files (warn at '
                    || orphan_warn_files || ')' END)
                ELSE 'validated, no open problems' END,
           CASE WHEN f.open_problems > 0 THEN f.problems_since
                WHEN f.first_validated_at IS NULL THEN f.created_at
                WHEN lagging OR orphaned THEN least(
                  CASE WHEN lagging THEN f.chain_since END,
                  CASE WHEN orphaned THEN f.oldest_orphan_at END)
                ELSE greatest(f.first_validated_at, f.last_resolved_at) END
    FROM state_store_facts f,
         LATERAL (SELECT f.deltas_since_snapshot >= lag_warn_deltas AS lagging,
                         f.orphan_files >= orphan_warn_files AS orphaned) t
$$;
COMMENT ON FUNCTION state_store_status(integer, integer) IS
  'Each store''s status (healthy, degraded, broken, unknown), why, and since when.';
"""

STORE_HEALTH = f"""
CREATE VIEW state_store_health AS
WITH live AS (
    SELECT store_id,
           count(*) AS live_files,
           sum(size_bytes) AS live_bytes,
           count(*) FILTER (WHERE state = 'orphan') AS orphan_files,
           coalesce(sum(size_bytes) FILTER (WHERE state = 'orphan'), 0) AS orphan_bytes
    FROM checkpoint_files
    WHERE state IN {LIVE}
    GROUP BY store_id
), needed AS (
    SELECT DISTINCT file_id FROM state_needed_files(2)
), reclaimable AS (
    SELECT f.store_id, count(*) AS files, sum(f.size_bytes) AS bytes
    FROM checkpoint_files f
    LEFT JOIN needed n ON n.file_id = f.file_id
    WHERE f.state IN {LIVE} AND n.file_id IS NULL
    GROUP BY f.store_id
), newest AS (
    SELECT checkpoint_root, max(latest_version) AS version
    FROM stores
    GROUP BY checkpoint_root
)
SELECT s.store_id, s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       st.status, st.status_reason, st.status_since,
       s.latest_version, s.latest_checkpoint_id, s.last_committed_at,
       now() - s.last_committed_at AS commit_lag,
       newest.version - s.latest_version AS versions_behind,
       facts.last_snapshot_version, facts.deltas_since_snapshot,
       coalesce(latest_file.rows, 0) AS state_rows,
       coalesce(live.live_files, 0) AS live_files,
       coalesce(live.live_bytes, 0) AS live_bytes,
       coalesce(live.orphan_files, 0) AS orphan_files,
       coalesce(live.orphan_bytes, 0) AS orphan_bytes,
       coalesce(reclaimable.files, 0) AS reclaimable_files,
       coalesce(reclaimable.bytes, 0) AS reclaimable_bytes,
       facts.open_problems, s.last_validated_at,
       s.last_run_id, r.kind AS last_run_kind, r.outcome AS last_run_outcome,
       r.ended_at AS last_run_ended_at
FROM stores s
JOIN newest ON newest.checkpoint_root = s.checkpoint_root
JOIN state_store_facts facts ON facts.store_id = s.store_id
JOIN state_store_status(20, 100) st ON st.store_id = s.store_id
LEFT JOIN commit_log c ON c.store_id = s.store_id AND c.version = s.latest_version
LEFT JOIN checkpoint_files latest_file ON latest_file.file_id = c.file_id
LEFT JOIN live ON live.store_id = s.store_id
LEFT JOIN reclaimable ON reclaimable.store_id = s.store_id
LEFT JOIN maintenance_runs r ON r.run_id = s.last_run_id;
COMMENT ON VIEW state_store_health IS
  'One row per store with its status at the default thresholds (20 deltas, 100 orphans; '
  'state_store_status(lag, orphans) for others). reclaimable_* = live files not needed by the '
  '2 newest committed versions (the retention floor), whatever their age: the most cleanup '
  'can free.';
"""

DROP_0003 = (
    "DROP VIEW state_store_health",
    "DROP FUNCTION state_file_verdicts(integer, interval, interval)",
    "DROP FUNCTION state_needed_files(integer)",
)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for statement in DROP_0003:
            op.execute(statement)
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

    if postgres:
        for statement in (RETAINED, NEEDED_FILES, FILE_VERDICTS, STORE_FACTS, STORE_STATUS):
            op.execute(statement)
        op.execute(STORE_HEALTH)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute("DROP VIEW state_store_health")
        op.execute("DROP FUNCTION state_store_status(integer, integer)")
        op.execute("DROP VIEW state_store_facts")
        op.execute("DROP FUNCTION state_file_verdicts(integer, interval, interval)")
        op.execute("DROP FUNCTION state_needed_files(integer)")
        op.execute("DROP FUNCTION state_retained_versions(integer)")
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
    if postgres:
        previous = load_python_file(
            str(Path(__file__).parent), "0003_operator_views.py"
        )  # the 0003 views and functions, restored as they were
        op.execute(previous.NEEDED_FILES)
        op.execute(previous.FILE_VERDICTS)
        op.execute(previous.STORE_HEALTH)
