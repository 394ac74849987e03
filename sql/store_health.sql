-- Store health: one row per store, longest delta chain first.
--
--   psql "$CATALOG" -f sql/store_health.sql                     # every store
--   psql "$CATALOG" -v root=/data/ckpt -f sql/store_health.sql  # one checkpoint root
--
-- commit_lag is the time since the store's last commit; versions_behind how far it trails
-- the newest store of its root. reclaimable_* count live files the 2 newest committed
-- versions do not need (the retention floor), whatever their age: the most cleanup can free.
\if :{?root}
\else
\set root ''
\endif
SELECT checkpoint_root, operator_id, partition_id, store_name,
       latest_version, commit_lag, versions_behind,
       deltas_since_snapshot, last_snapshot_version, state_rows,
       live_files, live_bytes, orphan_files, orphan_bytes,
       reclaimable_files, reclaimable_bytes,
       last_run_id, last_run_kind, last_run_outcome, last_run_ended_at
FROM state_store_health
WHERE :'root' = '' OR checkpoint_root = :'root'
ORDER BY deltas_since_snapshot DESC, checkpoint_root, operator_id, partition_id, store_name;
