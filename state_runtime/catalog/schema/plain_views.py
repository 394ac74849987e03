"""The plain views' SQL: version history, lineage, deletions, and PostgreSQL's root URI function.

Written as SQL text, not derived from a rule; :mod:`~state_runtime.catalog.schema.operator_views`
creates them with the rest at every upgrade.
"""

from __future__ import annotations

from state_runtime.catalog.schema.predicates import is_verified_snapshot_by_row, render

VERSION_HISTORY = """
CREATE VIEW state_version_history AS
SELECT s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       c.query_id, c.batch_id, c.version, c.checkpoint_id, c.committed_at,
       f.rows AS state_rows, f.kind, f.path, f.size_bytes, f.file_rows, f.state,
       f.verification, f.created_at AS written_at,
       d.deleted_at, d.run_id AS deleted_by_run, d.reason AS deletion_reason
FROM commit_log c
JOIN stores s ON s.store_id = c.store_id
LEFT JOIN checkpoint_files f
  ON f.store_id = c.store_id AND f.version = c.version AND f.checkpoint_id = c.checkpoint_id
LEFT JOIN deletion_ledger d ON d.file_id = f.file_id
"""

LINEAGE = f"""
CREATE VIEW state_lineage AS
WITH bases AS (
    SELECT c.store_id, c.version, c.checkpoint_id,
           coalesce((SELECT max(snap.version) FROM checkpoint_files snap
                     WHERE snap.store_id = c.store_id
                       AND {render(is_verified_snapshot_by_row, "snap")}
                       AND snap.version <= c.version), 0) AS base_version
    FROM commit_log c
)
SELECT s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       b.version, b.checkpoint_id, b.base_version,
       f.version AS file_version, f.kind, f.path, f.state, f.verification, f.size_bytes
FROM bases b
JOIN stores s ON s.store_id = b.store_id
JOIN checkpoint_files f ON f.store_id = b.store_id
 AND (({render(is_verified_snapshot_by_row, "f")} AND f.version = b.base_version)
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
      WHEN root LIKE '/%' THEN 'file://' || coalesce((
        -- percent-encoded byte by byte, as Path.as_uri (how the runtime records a root)
        SELECT string_agg(CASE
            WHEN b BETWEEN 48 AND 57 OR b BETWEEN 65 AND 90 OR b BETWEEN 97 AND 122
              OR b IN (45, 46, 47, 95, 126) THEN chr(b)
            ELSE '%' || upper(lpad(to_hex(b), 2, '0')) END, '' ORDER BY i)
        FROM (SELECT i, get_byte(convert_to(rtrim(root, '/'), 'UTF8'), i) AS b
              FROM generate_series(0, octet_length(convert_to(rtrim(root, '/'), 'UTF8')) - 1)
                AS i) AS bytes), '')
      ELSE regexp_replace(rtrim(root, '/'), '^s3a://', 's3://')
    END
$$
"""
