"""Dagster's status of a few store partitions, read without listing the fleet's.

``DagsterInstance.get_status_by_partition`` brings the asset's status cache up to date first:
at 100,000 partitions that deserializes, rebuilds and writes back every materialized
partition's key, and the caller has to list the partitions to ask (``get_dynamic_partitions``):
8 s of a failures tick that needed a handful (``docs/maintenance.md``, *Ticks after a status
change*). Here, as the cache builds its *Failed* and *in progress* subsets
(``build_failed_and_in_progress_partition_subset``): the event log's partitions whose latest
materialization attempt has no materialization after it (one grouped read of the asset's
index, the same whatever the cursor knows), and the status of those attempts' runs; then which
of those and of the partitions asked about exist (one membership query).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from dagster import AssetPartitionStatus, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.dagster_run import FINISHED_STATUSES

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores

RUNS_A_READ = 100  # run ids a runs query names, as the status cache reads them


def open_attempts(instance: DagsterInstance) -> dict[str, AssetPartitionStatus]:
    """The partitions (existing or not) whose latest attempt failed (its run failed) or is in
    progress (its run is not finished); an attempt whose run finished otherwise, or was
    deleted, counts as neither, as in Dagster's cache."""
    attempts = instance.event_log_storage.get_latest_asset_partition_materialization_attempts_without_materializations(  # noqa: E501
        state_checkpoints.key
    )
    run_ids = sorted({run_id for run_id, _ in attempts.values()})
    runs: dict[str, DagsterRunStatus] = {}
    for start in range(0, len(run_ids), RUNS_A_READ):
        chunk = run_ids[start : start + RUNS_A_READ]
        runs |= {r.run_id: r.status for r in instance.get_runs(RunsFilter(run_ids=chunk))}
    found = {}
    for partition, (run_id, _) in attempts.items():
        status = runs.get(run_id)
        if status is DagsterRunStatus.FAILURE:
            found[partition] = AssetPartitionStatus.FAILED
        elif status is not None and status not in FINISHED_STATUSES:
            found[partition] = AssetPartitionStatus.IN_PROGRESS
    return found


def store_partition_statuses(
    instance: DagsterInstance, named: Collection[str]
) -> Mapping[str, AssetPartitionStatus | None]:
    """Each existing partition among ``named`` and those Dagster shows *Failed* or in
    progress, with that status (None: neither, whether materialized or not)."""
    shown = open_attempts(instance)
    existing = instance.get_existing_dynamic_partitions(
        state_stores.name or "", sorted({*named, *shown})
    )
    return {partition: shown.get(partition) for partition in sorted(existing)}
