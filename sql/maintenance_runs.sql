-- Recent maintenance runs (snapshot, cleanup, validate, reconcile), newest first.
--
--   psql "$CATALOG" [-v limit=20] -f sql/maintenance_runs.sql
\if :{?limit}
\else
\set limit 20
\endif
SELECT run_id, kind, owner, outcome, started_at, ended_at,
       ended_at - started_at AS duration, counts, error
FROM maintenance_runs
ORDER BY started_at DESC, run_id DESC
LIMIT :'limit'::int;
