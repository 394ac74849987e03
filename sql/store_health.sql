-- Store health: one row per store with its status, longest delta chain first.
--
--   psql "$CATALOG" -f sql/store_health.sql                     # every store
--   psql "$CATALOG" -v root=/data/ckpt -f sql/store_health.sql  # one checkpoint root
--   psql "$CATALOG" -v lag_warn=20 -v orphan_warn=100 -f sql/store_health.sql
--   psql "$CATALOG" [-v retain=2] [-v retention='1 hour'] [-v grace='1 hour'] -f ...
--
-- status is healthy, degraded, broken or unknown, with the reason and since when: the same
-- status `statestore health` and Dagster show (state_runtime/status.py). broken:
-- an open problem (validation found a missing, corrupt or mislabelled file, or a broken
-- lineage); unknown: never validated; degraded: lag_warn or more deltas since the last
-- verified snapshot, or orphan_warn or more orphan files.
-- commit_lag is the time since the store's last commit; versions_behind how far it trails
-- the newest store of its root. reclaimable_* count the files cleanup may delete now under
-- the retention policy (retain, retention, grace): what `statestore health` shows.
-- Every variable left unset takes the maintenance settings' default (state_policy_defaults).
\if :{?root}
\else
\set root ''
\endif
\ir include/retention_defaults.psql
\if :{?lag_warn}
\else
SELECT lag_warn_deltas AS lag_warn FROM state_policy_defaults \gset
\endif
\if :{?orphan_warn}
\else
SELECT orphan_warn_files AS orphan_warn FROM state_policy_defaults \gset
\endif
SELECT checkpoint_root, operator_id, partition_id, store_name,
       status, status_reason, status_since,
       latest_version, commit_lag, versions_behind,
       deltas_since_snapshot, last_snapshot_version, state_rows,
       live_files, live_bytes, orphan_files, orphan_bytes,
       reclaimable_files, reclaimable_bytes, open_problems, last_validated_at,
       last_run_id, last_run_kind, last_run_outcome, last_run_ended_at
FROM state_store_health_at(:'retain'::int, :'retention'::interval, :'grace'::interval,
                           :'lag_warn'::int, :'orphan_warn'::int)
WHERE :'root' = '' OR checkpoint_root IN (:'root', state_root_uri(:'root'))
ORDER BY deltas_since_snapshot DESC, checkpoint_root, operator_id, partition_id, store_name;
