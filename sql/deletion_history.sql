-- Deletion history: every file cleanup deleted, when, by which run, and why.
--
--   psql "$CATALOG" [-v since='7 days'] [-v root=/data/ckpt] -f sql/deletion_history.sql
\if :{?since}
\else
\set since '7 days'
\endif
\if :{?root}
\else
\set root ''
\endif
SELECT d.deleted_at, d.run_id, r.owner AS run_owner,
       s.checkpoint_root, s.operator_id, s.partition_id, s.store_name,
       f.path, f.kind, f.version, f.size_bytes, d.reason
FROM deletion_ledger d
JOIN checkpoint_files f ON f.file_id = d.file_id
JOIN stores s ON s.store_id = f.store_id
JOIN maintenance_runs r ON r.run_id = d.run_id
WHERE d.deleted_at >= now() - :'since'::interval
  AND (:'root' = '' OR s.checkpoint_root IN (:'root', state_root_uri(:'root')))
ORDER BY d.deleted_at DESC, d.deletion_id DESC;
