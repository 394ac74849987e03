"""Operator views and functions for psql (PostgreSQL only; SQLite users have the Python API).

- ``state_needed_files(retain_versions)``: each file a retained committed version loads
  through, with the retained version that needs it.
- ``state_file_verdicts(retain_versions, retention, orphan_grace)``: every live or claimed
  file with its verdict (needed, within_window, in_flight, orphan_in_grace,
  deletable_superseded, deletable_orphan, deletable_uncommitted, deleting) and the reason.
- ``state_store_health``: one row per store: latest version, commit lag, deltas since the
  last snapshot, rows, bytes, orphans, reclaimable files at the retention floor, last run.

The rules are those of ``state_runtime/catalog/retention_sql.py``; a test checks both agree.
Revision ID: 0003_operator_views
Revises: 0002_batch_metrics
Create Date: 2025-01-03
"""

from __future__ import annotations

from alembic import op

revision = "0003_operator_views"
down_revision: str | None = "0002_batch_metrics"
branch_labels: str | None = None
depends_on: str | None = None

LIVE = "('written', 'committed', 'orphan')"

NEEDED_FILES = """
CREATE FUNCTION state_needed_files(retain_versions integer)
RETURNS TABLE (file_id bigint, store_id bigint, retained_version bigint)
LANGUAGE sql STABLE AS $$
    -- Commits keep each store's committed versions one linear, gapless chain, so the retained
    -- versions are latest - k, and version r loads from the newest committed snapshot at or
    -- below r (version s; 0: none) and the committed deltas s+1..r: the loader's walk down
    -- the base ids, in closed form.
    WITH versions AS (
        SELECT s.store_id, s.latest_version - k AS retained_version
        FROM stores s
        CROSS JOIN generate_series(0, greatest(retain_versions, 2) - 1) AS k
        WHERE s.latest_version - k >= 1
    ), retained AS (
        SELECT v.store_id, v.retained_version,
               coalesce((SELECT max(snap.version) FROM checkpoint_files snap
                         WHERE snap.store_id = v.store_id AND snap.kind = 'snapshot'
                           AND snap.state = 'committed' AND snap.version <= v.retained_version),
                        0) AS base_version
        FROM versions v
    )
    SELECT f.file_id, f.store_id, r.retained_version
    FROM retained r
    JOIN checkpoint_files f
      ON f.store_id = r.store_id AND f.version = r.base_version
     AND f.kind = 'snapshot' AND f.state = 'committed'
    UNION ALL
    SELECT f.file_id, f.store_id, r.retained_version
    FROM retained r
    JOIN checkpoint_files f
      ON f.store_id = r.store_id AND f.version > r.base_version
     AND f.version <= r.retained_version AND f.kind = 'delta' AND f.state = 'committed'
$$;
COMMENT ON FUNCTION state_needed_files(integer) IS
  'Files each of the last N committed versions (N >= 2) loads through.';
"""

FILE_VERDICTS = """
CREATE FUNCTION state_file_verdicts(
    retain_versions integer, retention interval, orphan_grace interval)
RETURNS TABLE (
    file_id bigint, store_id bigint, checkpoint_root text, operator_id integer,
    partition_id integer, store_name varchar, path text, kind varchar, version bigint,
    checkpoint_id varchar, state varchar, size_bytes bigint, created_at timestamptz,
    needed_from bigint, needed_to bigint, verdict text, reason text)
LANGUAGE sql STABLE AS $$
    WITH needed AS (
        SELECT n.file_id, min(n.retained_version) AS needed_from,
               max(n.retained_version) AS needed_to
        FROM state_needed_files(retain_versions) n
        GROUP BY n.file_id
    ), judged AS (
        SELECT f.*, n.needed_from, n.needed_to,
               CASE
                 WHEN n.file_id IS NOT NULL THEN 'needed'
                 WHEN f.state = 'deleting' THEN 'deleting'
                 WHEN f.state = 'committed' THEN
                   CASE WHEN f.created_at <= now() - retention
                        THEN 'deletable_superseded' ELSE 'within_window' END
                 WHEN f.state = 'orphan' THEN
                   CASE WHEN f.created_at <= now() - greatest(retention, orphan_grace)
                        THEN 'deletable_orphan' ELSE 'orphan_in_grace' END
                 WHEN f.created_at <= now() - greatest(retention, orphan_grace)
                   THEN 'deletable_uncommitted'
                 ELSE 'in_flight'
               END AS verdict
        FROM checkpoint_files f
        LEFT JOIN needed n ON n.file_id = f.file_id
        WHERE f.state IN ('written', 'committed', 'orphan', 'deleting')
    )
    SELECT j.file_id, j.store_id, s.checkpoint_root, s.operator_id, s.partition_id,
           s.store_name, j.path, j.kind, j.version, j.checkpoint_id, j.state, j.size_bytes,
           j.created_at, j.needed_from, j.needed_to, j.verdict,
           CASE j.verdict
             WHEN 'needed' THEN
               'needed to load retained ' || CASE WHEN j.needed_from = j.needed_to
                 THEN 'version ' || j.needed_from
                 ELSE 'versions ' || j.needed_from || '..' || j.needed_to END
             WHEN 'deleting' THEN 'claimed for deletion by cleanup run ' || j.claimed_by_run
             WHEN 'within_window' THEN
               'committed, no longer needed, younger than the retention window'
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
), snapshots AS (
    SELECT store_id, max(version) AS version
    FROM checkpoint_files
    WHERE kind = 'snapshot' AND state = 'committed'
    GROUP BY store_id
), newest AS (
    SELECT checkpoint_root, max(latest_version) AS version
    FROM stores
    GROUP BY checkpoint_root
)
SELECT s.store_id, s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       s.latest_version, s.latest_checkpoint_id, s.last_committed_at,
       now() - s.last_committed_at AS commit_lag,
       newest.version - s.latest_version AS versions_behind,
       coalesce(snapshots.version, 0) AS last_snapshot_version,
       s.latest_version - coalesce(snapshots.version, 0) AS deltas_since_snapshot,
       coalesce(latest_file.rows, 0) AS state_rows,
       coalesce(live.live_files, 0) AS live_files,
       coalesce(live.live_bytes, 0) AS live_bytes,
       coalesce(live.orphan_files, 0) AS orphan_files,
       coalesce(live.orphan_bytes, 0) AS orphan_bytes,
       coalesce(reclaimable.files, 0) AS reclaimable_files,
       coalesce(reclaimable.bytes, 0) AS reclaimable_bytes,
       s.last_run_id, r.kind AS last_run_kind, r.outcome AS last_run_outcome,
       r.ended_at AS last_run_ended_at
FROM stores s
JOIN newest ON newest.checkpoint_root = s.checkpoint_root
LEFT JOIN snapshots ON snapshots.store_id = s.store_id
LEFT JOIN commit_log c ON c.store_id = s.store_id AND c.version = s.latest_version
LEFT JOIN checkpoint_files latest_file ON latest_file.file_id = c.file_id
LEFT JOIN live ON live.store_id = s.store_id
LEFT JOIN reclaimable ON reclaimable.store_id = s.store_id
LEFT JOIN maintenance_runs r ON r.run_id = s.last_run_id;
COMMENT ON VIEW state_store_health IS
  'One row per store. reclaimable_* = live files not needed by the 2 newest committed versions '
  '(the retention floor), whatever their age: the most cleanup can free.';
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(NEEDED_FILES)
    op.execute(FILE_VERDICTS)
    op.execute(STORE_HEALTH)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP VIEW state_store_health")
    op.execute("DROP FUNCTION state_file_verdicts(integer, interval, interval)")
    op.execute("DROP FUNCTION state_needed_files(integer)")
