-- Why is this file kept, or why may it be deleted?
--
--   psql "$CATALOG" -v root=/data/ckpt -v path=state/0/3/default/41_<id>.delta \
--        [-v retain=2] [-v retention='1 hour'] [-v grace='1 hour'] -f sql/explain_file.sql
--
-- path is relative to the checkpoint root, as the catalog records it. No row: the catalog
-- has never heard of the file (a reconciliation sweep records such files as orphans).
-- A file whose last verification failed is never called needed: its verdict is 'missing' or
-- 'damaged' with what was found; `statestore explain` also says which retained versions
-- still load without it (and checks storage for files nobody has verified yet).
\if :{?root}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/explain_file.sql needs -v root=...: the checkpoint root (a path or URI)'; END $$;
\endif
\if :{?path}
\else
\set ON_ERROR_STOP 1
\set VERBOSITY terse
DO $$ BEGIN RAISE EXCEPTION 'sql/explain_file.sql needs -v path=...: the file path relative to the root'; END $$;
\endif
\ir include/retention_defaults.psql
SELECT v.path, v.kind, v.version, v.checkpoint_id, v.state, v.verification, v.size_bytes,
       v.created_at, v.recorded_at,
       CASE WHEN f.verification <> 'failed' THEN v.verdict
            WHEN f.verification_note = 'file is missing from storage' THEN 'missing'
            ELSE 'damaged' END AS verdict,
       v.needed_from, v.needed_to,
       CASE WHEN f.verification <> 'failed' THEN v.reason
            ELSE v.kind || ' ' || coalesce(f.verification_note, 'failed verification')
                 || ' (found ' || f.verified_at || ')'
                 || CASE WHEN v.needed_from IS NULL THEN ''
                    ELSE '; retained versions ' || v.needed_from || '..' || v.needed_to
                         || ' load through it: they cannot be loaded from intact files' END
            END AS reason
FROM state_file_verdicts(:'retain'::int, :'retention'::interval, :'grace'::interval) v
JOIN checkpoint_files f ON f.file_id = v.file_id
WHERE v.checkpoint_root IN (:'root', state_root_uri(:'root')) AND v.path = :'path'
UNION ALL
SELECT f.path, f.kind, f.version, f.checkpoint_id, f.state, f.verification, f.size_bytes,
       f.created_at, f.recorded_at, 'deleted', NULL, NULL,
       'deleted at ' || d.deleted_at || ' by cleanup run ' || d.run_id || ': ' || d.reason
FROM checkpoint_files f
JOIN stores s ON s.store_id = f.store_id
JOIN deletion_ledger d ON d.file_id = f.file_id
WHERE s.checkpoint_root IN (:'root', state_root_uri(:'root')) AND f.path = :'path';
