-- Stores whose committed delta chain since the last snapshot reached a threshold.
--
--   psql "$CATALOG" -v min_deltas=10 -f sql/snapshot_candidates.sql
--
-- min_deltas defaults to 10. The last snapshot counts only if it is committed: the commit
-- log names its (version, checkpoint id), so it lies on the latest version's lineage.
\if :{?min_deltas}
\else
SELECT snapshot_min_deltas AS min_deltas FROM state_policy_defaults \gset
\endif
SELECT checkpoint_root, operator_id, partition_id, store_name,
       latest_version, last_snapshot_version, deltas_since_snapshot, live_bytes
FROM state_store_health
WHERE latest_version > 0 AND deltas_since_snapshot >= :'min_deltas'::int
ORDER BY deltas_since_snapshot DESC, checkpoint_root, operator_id, partition_id, store_name;
