-- Store health: one row per store with its status, longest delta chain first.
--
--   psql "$CATALOG" -f sql/store_health.sql                     # every store
--   psql "$CATALOG" -v root=/data/ckpt -f sql/store_health.sql  # one checkpoint root
--   psql "$CATALOG" -v lag_warn=20 -v orphan_warn=100 -f sql/store_health.sql
--
-- status is healthy, degraded, broken or unknown, with the reason and since when: the same
-- status `statestore health` and Dagster show (state_runtime/status.py). broken:
-- an open problem (validation found a missing, corrupt or mislabelled file, or a broken
-- lineage); unknown: never validated; degraded: lag_warn or more deltas since the last
-- verified snapshot, or orphan_warn or more orphan files.
-- commit_lag is the time since the store's last commit; versions_behind how far it trails
-- the newest store of its root. reclaimable_* count live files the 2 newest committed
-- versions do not need (the retention floor), whatever their age: the most cleanup can free.
\if :{?root}
\else
\set root ''
\endif
\if :{?lag_warn}
\else
\set lag_warn 20
\endif
\if :{?orphan_warn}
\else
\set orphan_warn 100
\endif
SELECT h.checkpoint_root, h.operator_id, h.partition_id, h.store_name,
       st.status, st.status_reason, st.status_since,
       h.latest_version, h.commit_lag, h.versions_behind,
       h.deltas_since_snapshot, h.last_snapshot_version, h.state_rows,
       h.live_files, h.live_bytes, h.orphan_files, h.orphan_bytes,
       h.reclaimable_files, h.reclaimable_bytes, h.open_problems, h.last_validated_at,
       h.last_run_id, h.last_run_kind, h.last_run_outcome, h.last_run_ended_at
FROM state_store_health h
JOIN state_store_status(:'lag_warn'::int, :'orphan_warn'::int) st ON st.store_id = h.store_id
WHERE :'root' = '' OR h.checkpoint_root IN (:'root', state_root_uri(:'root'))
ORDER BY h.deltas_since_snapshot DESC, h.checkpoint_root, h.operator_id, h.partition_id,
         h.store_name;
