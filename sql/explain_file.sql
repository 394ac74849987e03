-- Why is this file kept, or why may it be deleted?
--
--   psql "$CATALOG" -v root=/data/ckpt -v path=state/0/3/default/41_<id>.delta \
--        [-v retain=2] [-v retention='1 hour'] [-v grace='1 hour'] -f sql/explain_file.sql
--
-- path is relative to the checkpoint root, as the catalog records it. No row: the catalog
-- has never heard of the file (a reconciliation sweep records such files as orphans).
\if :{?retain}
\else
\set retain 2
\endif
\if :{?retention}
\else
\set retention '1 hour'
\endif
\if :{?grace}
\else
\set grace '1 hour'
\endif
SELECT v.path, v.kind, v.version, v.checkpoint_id, v.state, v.size_bytes, v.created_at,
       v.verdict, v.needed_from, v.needed_to, v.reason
FROM state_file_verdicts(:'retain'::int, :'retention'::interval, :'grace'::interval) v
WHERE v.checkpoint_root = :'root' AND v.path = :'path'
UNION ALL
SELECT f.path, f.kind, f.version, f.checkpoint_id, f.state, f.size_bytes, f.created_at,
       'deleted', NULL, NULL,
       'deleted at ' || d.deleted_at || ' by cleanup run ' || d.run_id || ': ' || d.reason
FROM checkpoint_files f
JOIN stores s ON s.store_id = f.store_id
JOIN deletion_ledger d ON d.file_id = f.file_id
WHERE s.checkpoint_root = :'root' AND f.path = :'path';
