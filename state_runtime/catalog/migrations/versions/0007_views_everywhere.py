"""The operators' views on SQLite too, and roots relative to a SQLite catalog's folder.

Views created on both dialects (plain SQL both can express):

- ``state_version_history``: every file of every committed version (its delta, its
  snapshots) with the batch and query that committed it and, once deleted, when, by which run
  and why: ``statestore history`` in SQL.
- ``state_lineage``: for every committed version, the files that load it (the newest
  verified committed snapshot at or below it, then the committed deltas above it), each with
  its state: a version whose rows are not all 'committed' cannot be loaded any more.
- ``state_deletions``: the deletion ledger with each file, its store and the run.
- ``state_cleanup_preview``: every live or claimed file with its verdict and reason under the
  default policy (2 versions, 1 hour window, 1 hour orphan grace); the deletable ones are
  what cleanup would delete now. On PostgreSQL it reads ``state_file_verdicts(2, '1 hour',
  '1 hour')``; other policies: that function (PostgreSQL) or ``statestore maintain --json``.

PostgreSQL only: ``state_root_uri(root)``, a root as the catalog records it: a plain path
(``/data/ckpt``, trailing slash or not) becomes its ``file://`` URI, ``s3a://`` becomes
``s3://``; the files in ``sql/`` accept either spelling for ``-v root=...``.

SQLite only (PostgreSQL has had them since 0006): ``state_store_health``, each store's
status at the default thresholds (20 deltas, 100 orphans) and figures, as
``statestore health`` shows them.

Roots: a SQLite catalog file stores the local roots inside its folder relative to it
(``./checkpoint``; see ``state_runtime/catalog/roots.py``), so the folder can be moved or
copied whole. This revision converts the existing rows.

Revision ID: 0007_views_everywhere
Revises: 0006_verified_snapshots
Create Date: 2026-11-23
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from state_runtime.catalog.roots import resolved_root, stored_root

revision = "0007_views_everywhere"
down_revision: str | None = "0006_verified_snapshots"
branch_labels: str | None = None
depends_on: str | None = None

VERIFIED_SNAPSHOT = "kind = 'snapshot' AND state = 'committed' AND verification = 'verified'"

VERSION_HISTORY = """
CREATE VIEW state_version_history AS
SELECT s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       c.query_id, c.batch_id, c.version, c.checkpoint_id, c.committed_at,
       f.rows AS state_rows, f.kind, f.path, f.size_bytes, f.file_rows, f.state,
       f.verification, f.created_at AS written_at,
       d.deleted_at, d.run_id AS deleted_by_run, d.reason AS deletion_reason
FROM commit_log c
JOIN stores s ON s.store_id = c.store_id
JOIN checkpoint_files f
  ON f.store_id = c.store_id AND f.version = c.version AND f.checkpoint_id = c.checkpoint_id
LEFT JOIN deletion_ledger d ON d.file_id = f.file_id
"""

LINEAGE = f"""
CREATE VIEW state_lineage AS
WITH bases AS (
    SELECT c.store_id, c.version, c.checkpoint_id,
           coalesce((SELECT max(snap.version) FROM checkpoint_files snap
                     WHERE snap.store_id = c.store_id AND snap.{VERIFIED_SNAPSHOT}
                       AND snap.version <= c.version), 0) AS base_version
    FROM commit_log c
)
SELECT s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       b.version, b.checkpoint_id, b.base_version,
       f.version AS file_version, f.kind, f.path, f.state, f.verification, f.size_bytes
FROM bases b
JOIN stores s ON s.store_id = b.store_id
JOIN checkpoint_files f ON f.store_id = b.store_id
 AND ((f.{VERIFIED_SNAPSHOT} AND f.version = b.base_version)
      OR f.file_id IN (SELECT step.file_id FROM commit_log step
                       WHERE step.store_id = b.store_id AND step.version > b.base_version
                         AND step.version <= b.version))
"""

DELETIONS = """
CREATE VIEW state_deletions AS
SELECT d.deleted_at, d.run_id, r.kind AS run_kind, r.owner AS run_owner,
       s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       f.path, f.kind, f.version, f.checkpoint_id, f.size_bytes, d.reason
FROM deletion_ledger d
JOIN checkpoint_files f ON f.file_id = d.file_id
JOIN stores s ON s.store_id = f.store_id
JOIN maintenance_runs r ON r.run_id = d.run_id
"""

PG_ROOT_URI = """
CREATE FUNCTION state_root_uri(root text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
      WHEN root LIKE '/%' THEN
        'file://' || replace(replace(rtrim(root, '/'), '%', '%25'), ' ', '%20')
      ELSE regexp_replace(rtrim(root, '/'), '^s3a://', 's3://')
    END
$$;
COMMENT ON FUNCTION state_root_uri(text) IS
  'A checkpoint root as the catalog records it: a plain path becomes its file:// URI.';
"""

PG_CLEANUP_PREVIEW = """
CREATE VIEW state_cleanup_preview AS
SELECT * FROM state_file_verdicts(2, interval '1 hour', interval '1 hour')
"""

# SQLite: the rule of state_runtime/retention.py at the default policy, as 0006 writes it for
# PostgreSQL (timestamps are UTC text, so they compare as text).
SQLITE_CUTOFF = "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hours')"
SQLITE_CLEANUP_PREVIEW = f"""
CREATE VIEW state_cleanup_preview AS
WITH retained AS (
    SELECT s.store_id, s.latest_version - k.k AS retained_version
    FROM stores s CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1) k
    WHERE s.latest_version - k.k >= 1
), bases AS (
    SELECT r.store_id, r.retained_version,
           coalesce((SELECT max(snap.version) FROM checkpoint_files snap
                     WHERE snap.store_id = r.store_id AND snap.{VERIFIED_SNAPSHOT}
                       AND snap.version <= r.retained_version), 0) AS base_version
    FROM retained r
), needed AS (
    SELECT f.file_id, min(b.retained_version) AS needed_from,
           max(b.retained_version) AS needed_to
    FROM bases b
    JOIN checkpoint_files f ON f.store_id = b.store_id AND f.state = 'committed'
     AND ((f.kind = 'snapshot' AND f.verification = 'verified' AND f.version = b.base_version)
          OR (f.kind = 'delta' AND f.version > b.base_version
              AND f.version <= b.retained_version))
    GROUP BY f.file_id
), floors AS (
    SELECT store_id, min(base_version) AS floor_version FROM bases GROUP BY store_id
), held AS (
    SELECT DISTINCT store_id FROM store_problems WHERE resolved_at IS NULL
), judged AS (
    SELECT f.*, n.needed_from, n.needed_to, fl.floor_version,
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
             WHEN f.state = 'committed' AND f.created_at <= {SQLITE_CUTOFF}
               THEN 'deletable_superseded'
             WHEN f.state = 'committed' THEN 'within_window'
             WHEN f.state = 'orphan' AND f.created_at <= {SQLITE_CUTOFF}
               THEN 'deletable_orphan'
             WHEN f.state = 'orphan' THEN 'orphan_in_grace'
             WHEN f.created_at <= {SQLITE_CUTOFF} THEN 'deletable_uncommitted'
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
           || ' (the last 2 committed)'
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
           'committed and no longer needed by the last 2 committed versions, but younger '
           || 'than the retention window (1:00:00)'
         WHEN 'deletable_superseded' THEN
           'superseded: not needed by the last 2 committed versions and older than the '
           || 'retention window (1:00:00); ' || CASE WHEN j.version >= j.floor_version
             THEN 'a newer snapshot, verified, replaces it'
             ELSE 'older than the retained versions and the snapshot they load from' END
         WHEN 'orphan_in_grace' THEN
           'orphan (' || coalesce(j.state_reason, 'None')
           || '), younger than the grace period (1:00:00)'
         WHEN 'deletable_orphan' THEN
           'orphan (' || coalesce(j.state_reason, 'None')
           || '), older than the grace period (1:00:00)'
         WHEN 'deletable_uncommitted' THEN
           'never committed: no commit names it and it is older than the grace period '
           || '(1:00:00)'
         ELSE 'written but not committed, younger than the grace period (1:00:00): '
              || 'it may belong to a batch in flight'
       END AS reason
FROM judged j
JOIN stores s ON s.store_id = j.store_id
"""

# SQLite: state_store_health with the status rule of state_runtime/status.py at
# the default thresholds; commit_lag in seconds (SQLite has no interval type).
SQLITE_STORE_HEALTH = f"""
CREATE VIEW state_store_health AS
WITH live AS (
    SELECT store_id, count(*) AS live_files, sum(size_bytes) AS live_bytes,
           sum(CASE WHEN state = 'orphan' THEN 1 ELSE 0 END) AS orphan_files,
           sum(CASE WHEN state = 'orphan' THEN size_bytes ELSE 0 END) AS orphan_bytes,
           min(CASE WHEN state = 'orphan' THEN state_changed_at END) AS oldest_orphan_at
    FROM checkpoint_files
    WHERE state IN ('written', 'committed', 'orphan')
    GROUP BY store_id
), snapshots AS (
    SELECT store_id, max(version) AS version
    FROM checkpoint_files WHERE {VERIFIED_SNAPSHOT} GROUP BY store_id
), problems AS (
    SELECT store_id,
           sum(CASE WHEN resolved_at IS NULL THEN 1 ELSE 0 END) AS open_problems,
           min(CASE WHEN resolved_at IS NULL THEN detected_at END) AS problems_since,
           max(resolved_at) AS last_resolved_at
    FROM store_problems GROUP BY store_id
), first_problem AS (
    SELECT p.store_id, p.problem || coalesce(' (file ' || p.path || ')', '') AS text
    FROM store_problems p
    WHERE p.resolved_at IS NULL AND p.problem_id = (
        SELECT q.problem_id FROM store_problems q
        WHERE q.store_id = p.store_id AND q.resolved_at IS NULL
        ORDER BY q.detected_at, q.problem_id LIMIT 1)
), newest AS (
    SELECT checkpoint_root, max(latest_version) AS version FROM stores GROUP BY checkpoint_root
), facts AS (
    SELECT s.*, coalesce(snapshots.version, 0) AS last_snapshot_version,
           s.latest_version - coalesce(snapshots.version, 0) AS deltas_since_snapshot,
           chain.committed_at AS chain_since,
           coalesce(live.live_files, 0) AS live_files, coalesce(live.live_bytes, 0) AS live_bytes,
           coalesce(live.orphan_files, 0) AS orphan_files,
           coalesce(live.orphan_bytes, 0) AS orphan_bytes, live.oldest_orphan_at,
           coalesce(problems.open_problems, 0) AS open_problems, problems.problems_since,
           problems.last_resolved_at, first_problem.text AS first_problem,
           s.latest_version - coalesce(snapshots.version, 0) >= 20 AS lagging,
           coalesce(live.orphan_files, 0) >= 100 AS orphaned
    FROM stores s
    LEFT JOIN snapshots ON snapshots.store_id = s.store_id
    LEFT JOIN commit_log chain
      ON chain.store_id = s.store_id AND chain.version = coalesce(snapshots.version, 0) + 1
    LEFT JOIN live ON live.store_id = s.store_id
    LEFT JOIN problems ON problems.store_id = s.store_id
    LEFT JOIN first_problem ON first_problem.store_id = s.store_id
), reclaimable AS (
    SELECT store_id, count(*) AS files, sum(size_bytes) AS bytes
    FROM state_cleanup_preview WHERE verdict LIKE 'deletable%' GROUP BY store_id
)
SELECT f.store_id, f.checkpoint_root, f.operator_id, f.partition_id, f.store_name,
       CASE WHEN f.open_problems > 0 THEN 'broken'
            WHEN f.first_validated_at IS NULL THEN 'unknown'
            WHEN f.lagging OR f.orphaned THEN 'degraded'
            ELSE 'healthy' END AS status,
       CASE WHEN f.open_problems = 1 THEN f.first_problem
            WHEN f.open_problems > 1 THEN
              f.open_problems || ' open problems; first: ' || f.first_problem
            WHEN f.first_validated_at IS NULL THEN 'never validated'
            WHEN f.lagging AND f.orphaned THEN
              f.deltas_since_snapshot || ' deltas since the last verified snapshot (warn at 20); '
              || f.orphan_files || ' orphan files (warn at 100)'
            WHEN f.lagging THEN
              f.deltas_since_snapshot || ' deltas since the last verified snapshot (warn at 20)'
            WHEN f.orphaned THEN f.orphan_files || ' orphan files (warn at 100)'
            ELSE 'validated, no open problems' END AS status_reason,
       CASE WHEN f.open_problems > 0 THEN f.problems_since
            WHEN f.first_validated_at IS NULL THEN f.created_at
            WHEN f.lagging AND f.orphaned THEN min(f.chain_since, f.oldest_orphan_at)
            WHEN f.lagging THEN f.chain_since
            WHEN f.orphaned THEN f.oldest_orphan_at
            ELSE max(f.first_validated_at, coalesce(f.last_resolved_at, f.first_validated_at))
       END AS status_since,
       f.latest_version, f.latest_checkpoint_id, f.last_committed_at,
       (julianday('now') - julianday(f.last_committed_at)) * 86400.0 AS commit_lag_seconds,
       newest.version - f.latest_version AS versions_behind,
       f.last_snapshot_version, f.deltas_since_snapshot,
       coalesce(latest_file.rows, 0) AS state_rows,
       f.live_files, f.live_bytes, f.orphan_files, f.orphan_bytes,
       coalesce(reclaimable.files, 0) AS reclaimable_files,
       coalesce(reclaimable.bytes, 0) AS reclaimable_bytes,
       f.open_problems, f.last_validated_at,
       f.last_run_id, r.kind AS last_run_kind, r.outcome AS last_run_outcome,
       r.ended_at AS last_run_ended_at
FROM facts f
JOIN newest ON newest.checkpoint_root = f.checkpoint_root
LEFT JOIN commit_log c ON c.store_id = f.store_id AND c.version = f.latest_version
LEFT JOIN checkpoint_files latest_file ON latest_file.file_id = c.file_id
LEFT JOIN reclaimable ON reclaimable.store_id = f.store_id
LEFT JOIN maintenance_runs r ON r.run_id = f.last_run_id
"""

BOTH = {
    "state_version_history": VERSION_HISTORY,
    "state_lineage": LINEAGE,
    "state_deletions": DELETIONS,
}


def _catalog_folder() -> Path | None:
    """The folder of a SQLite catalog file being migrated (None: not a file)."""
    url = op.get_bind().engine.url
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in {"", ":memory:"}:
        return None
    return None if database.startswith("file:") else Path(database).absolute().parent


def _convert_roots(convert: object) -> None:
    """Rewrite every stored root with ``convert(root, folder)``."""
    folder = _catalog_folder()
    if folder is None:
        return
    bind = op.get_bind()
    for table in ("stores", "batch_metrics"):
        roots = bind.exec_driver_sql(f"SELECT DISTINCT checkpoint_root FROM {table}").scalars()
        for old in list(roots):
            new = convert(old, folder)  # type: ignore[operator]
            if new != old:
                bind.exec_driver_sql(
                    f"UPDATE {table} SET checkpoint_root = ? WHERE checkpoint_root = ?",
                    (new, old),
                )


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in BOTH.values():
        op.execute(statement)
    if postgres:
        op.execute(PG_ROOT_URI)
        op.execute(PG_CLEANUP_PREVIEW)
    else:
        op.execute(SQLITE_CLEANUP_PREVIEW)
        op.execute(SQLITE_STORE_HEALTH)
        _convert_roots(stored_root)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if not postgres:
        _convert_roots(resolved_root)
        op.execute("DROP VIEW state_store_health")
    op.execute("DROP VIEW state_cleanup_preview")
    if postgres:
        op.execute("DROP FUNCTION state_root_uri(text)")
    for name in reversed(list(BOTH)):
        op.execute(f"DROP VIEW {name}")
