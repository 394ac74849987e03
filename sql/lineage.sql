-- The lineage of a committed version: the files that load it, newest first.
--
--   psql "$CATALOG" -v root=/data/ckpt -v operator=0 -v partition=3 \
--        [-v store=default] [-v version=42] -f sql/lineage.sql
--
-- Starts at the committed (version, checkpoint id) (default: the latest) and follows each
-- delta's base checkpoint id down to a live snapshot or version 1, as the loader does. A
-- step whose snapshot and delta are both absent shows kind 'MISSING': the chain is broken;
-- a version that changed nothing shows 'unchanged (no file)' (its commit names its parent's
-- checkpoint) and the walk goes on at its parent.
-- verification: whether the file's bytes were checked since it was written; cleanup counts
-- only on verified snapshots (an unverified or failed one keeps its deltas).
\if :{?root}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/lineage.sql needs -v root=...: the checkpoint root (a path or URI)'; END $$;
\endif
\if :{?operator}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/lineage.sql needs -v operator=...: the operator id'; END $$;
\endif
\if :{?partition}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/lineage.sql needs -v partition=...: the partition id'; END $$;
\endif
\if :{?store}
\else
\set store default
\endif
\if :{?version}
\else
\set version ''
\endif
WITH RECURSIVE target AS (
    SELECT s.store_id, c.version, c.checkpoint_id
    FROM stores s
    JOIN commit_log c ON c.store_id = s.store_id
    WHERE s.checkpoint_root IN (:'root', state_root_uri(:'root'))
      AND s.operator_id = :'operator'::int
      AND s.partition_id = :'partition'::int
      AND s.store_name = :'store'
      AND c.version = coalesce(nullif(:'version', '')::bigint, s.latest_version)
), walk (store_id, version, checkpoint_id, depth) AS (
    SELECT store_id, version, checkpoint_id, 0 FROM target
  UNION ALL
    -- a version that changed nothing has no file: its commit names its parent's checkpoint
    SELECT w.store_id, w.version - 1, coalesce(d.base_checkpoint_id, w.checkpoint_id),
           w.depth + 1
    FROM walk w
    LEFT JOIN checkpoint_files d
      ON d.store_id = w.store_id AND d.version = w.version
     AND d.checkpoint_id = w.checkpoint_id AND d.kind = 'delta'
     AND state_is_live(d.state)
    LEFT JOIN commit_log idle
      ON idle.store_id = w.store_id AND idle.version = w.version
     AND idle.checkpoint_id = w.checkpoint_id AND idle.file_id IS NULL
    WHERE w.version > 1
      AND (d.file_id IS NOT NULL OR idle.commit_id IS NOT NULL)
      AND NOT EXISTS (
          SELECT 1 FROM checkpoint_files snap
          WHERE snap.store_id = w.store_id AND snap.version = w.version
            AND snap.checkpoint_id = w.checkpoint_id AND snap.kind = 'snapshot'
            AND state_is_live(snap.state))
)
SELECT w.depth, w.version, w.checkpoint_id,
       CASE WHEN snap.file_id IS NOT NULL THEN 'snapshot'
            WHEN delta.file_id IS NOT NULL THEN 'delta'
            WHEN idle.commit_id IS NOT NULL THEN 'unchanged (no file)'
            ELSE 'MISSING' END AS kind,
       coalesce(snap.path, delta.path) AS path,
       coalesce(snap.state, delta.state) AS state,
       coalesce(snap.verification, delta.verification) AS verification,
       coalesce(snap.size_bytes, delta.size_bytes) AS size_bytes,
       coalesce(snap.rows, delta.rows) AS state_rows,
       coalesce(snap.created_at, delta.created_at) AS created_at
FROM walk w
LEFT JOIN checkpoint_files snap
  ON snap.store_id = w.store_id AND snap.version = w.version
 AND snap.checkpoint_id = w.checkpoint_id AND snap.kind = 'snapshot'
 AND state_is_live(snap.state)
LEFT JOIN checkpoint_files delta
  ON delta.store_id = w.store_id AND delta.version = w.version
 AND delta.checkpoint_id = w.checkpoint_id AND delta.kind = 'delta'
 AND state_is_live(delta.state)
LEFT JOIN commit_log idle
  ON idle.store_id = w.store_id AND idle.version = w.version
 AND idle.checkpoint_id = w.checkpoint_id AND idle.file_id IS NULL
ORDER BY w.depth;
