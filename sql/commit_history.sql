-- A query's commit history: one row per committed micro-batch, newest first, with the
-- runtime's batch metrics when the driver recorded them.
--
--   psql "$CATALOG" -v query=<query id> [-v limit=50] -f sql/commit_history.sql
\if :{?query}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/commit_history.sql needs -v query=...: the query id (statestore history --by-batch lists them)'; END $$;
\endif
\if :{?limit}
\else
\set limit 50
\endif
SELECT c.batch_id,
       max(c.committed_at) AS committed_at,
       count(*) AS stores,
       min(c.version) AS min_version,
       max(c.version) AS max_version,
       sum(f.size_bytes) AS checkpoint_bytes,
       sum(f.rows) AS state_rows,  -- of the stores that changed
       m.rows_in, m.keys_updated, m.commit_ms, m.cache_hits, m.cache_misses
FROM commit_log c
LEFT JOIN checkpoint_files f ON f.file_id = c.file_id  -- none: the store changed nothing
JOIN stores s ON s.store_id = c.store_id
LEFT JOIN batch_metrics m
  ON m.checkpoint_root = s.checkpoint_root AND m.query_id = c.query_id
 AND m.batch_id = c.batch_id
WHERE c.query_id = :'query'
GROUP BY c.batch_id, m.rows_in, m.keys_updated, m.commit_ms, m.cache_hits, m.cache_misses
ORDER BY c.batch_id DESC
LIMIT :'limit'::int;
