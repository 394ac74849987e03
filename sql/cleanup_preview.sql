-- What cleanup would delete now, and why (a dry run; nothing is changed).
--
--   psql "$CATALOG" [-v retain=2] [-v retention='1 hour'] [-v grace='1 hour'] \
--        [-v root=/data/ckpt] -f sql/cleanup_preview.sql
--
-- retain: committed versions kept per store (values below 2 count as 2, the safety floor);
-- retention: no file younger than this is deleted; grace: a never-committed file (written
-- or orphan) must also be older than this. Same rules as the Python cleanup: a file's age
-- is by the database's clock, from the later of created_at (its writer's clock) and
-- recorded_at (when the catalog recorded it).
\ir include/retention_defaults.psql
\if :{?root}
\else
\set root ''
\endif
SELECT checkpoint_root, operator_id, partition_id, store_name, path, kind, version, state,
       size_bytes, created_at, recorded_at, verdict, reason
FROM state_file_verdicts(:'retain'::int, :'retention'::interval, :'grace'::interval)
WHERE verdict LIKE 'deletable%'
  AND (:'root' = '' OR checkpoint_root IN (:'root', state_root_uri(:'root')))
ORDER BY checkpoint_root, operator_id, partition_id, store_name, version, path;
