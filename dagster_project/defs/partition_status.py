"""Dagster's status of a few store partitions, read without listing the fleet's.

``DagsterInstance.get_status_by_partition`` brings the asset's status cache up to date first:
at 100,000 partitions that deserializes, rebuilds and writes back every materialized
partition's key, and the caller has to list the partitions to ask (``get_dynamic_partitions``):
8 s of a failures tick that needed a handful (``docs/maintenance.md``, *Ticks after a status
change*). Dagster's own query of the partitions with an attempt not followed by a
materialization groups every materialization of the asset (3 s at 100,000). Here, from the
event log's index by asset, event type and partition: the partitions attempted (a run planned
to materialize them) since the last read, with those asked about; of those that exist (one
membership query), the latest attempt and materialization of each (two grouped reads over
them alone); where the attempt is the later, its run's status decides, as in Dagster's cache:
*Failed* if the run failed, in progress while it runs. One difference: where the latest
attempt's run was canceled after an earlier one failed, the cache still shows *Failed*; here
the latest attempt decides (neither).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from dagster import (
    AssetPartitionStatus,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
)
from dagster._core.storage.dagster_run import FINISHED_STATUSES

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores

RUNS_A_READ = 100  # run ids a runs query names, as the status cache reads them


@dataclass(frozen=True)
class PartitionStatuses:
    """Each partition asked about or attempted since the last read that exists, with its
    status (None: neither failed nor in progress, whether materialized or not), and the event
    log's newest storage id when read: where the next read starts."""

    statuses: dict[str, AssetPartitionStatus | None]
    events: int

    @property
    def shown(self) -> list[str]:
        """The partitions Dagster shows *Failed* or in progress: asked about again next read."""
        return [p for p, status in self.statuses.items() if status is not None]


def run_statuses(
    instance: DagsterInstance, run_ids: Collection[str]
) -> dict[str, DagsterRunStatus]:
    ids = sorted(run_ids)
    found: dict[str, DagsterRunStatus] = {}
    for start in range(0, len(ids), RUNS_A_READ):
        chunk = ids[start : start + RUNS_A_READ]
        found |= {r.run_id: r.status for r in instance.get_runs(RunsFilter(run_ids=chunk))}
    return found


def store_partition_statuses(
    instance: DagsterInstance, named: Collection[str], after: int | None
) -> PartitionStatuses:
    """The statuses of the partitions ``named`` and of those attempted after storage id
    ``after`` (None: ever)."""
    storage, key = instance.event_log_storage, state_checkpoints.key
    events = storage.get_maximum_record_id() or 0
    planned = DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    attempted = storage.get_latest_storage_id_by_partition(key, planned, after_cursor=after)
    existing = instance.get_existing_dynamic_partitions(
        state_stores.name or "", sorted({*named, *attempted})
    )
    if not existing:
        return PartitionStatuses({}, events)
    latest = storage.get_latest_storage_id_by_partition(key, planned, partitions=set(existing))
    done = storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, partitions=set(existing)
    )
    open_ids = [i for p, i in latest.items() if i > done.get(p, 0)]
    records = (
        instance.fetch_planned_materializations(
            AssetRecordsFilter(key, storage_ids=open_ids), limit=len(open_ids)
        ).records
        if open_ids
        else []
    )
    run_of = {r.partition_key: r.run_id for r in records}
    runs = run_statuses(instance, set(run_of.values()))
    statuses: dict[str, AssetPartitionStatus | None] = {}
    for partition in sorted(existing):
        status = runs.get(run_of.get(partition, ""))
        if status is DagsterRunStatus.FAILURE:
            statuses[partition] = AssetPartitionStatus.FAILED
        elif status is not None and status not in FINISHED_STATUSES:
            statuses[partition] = AssetPartitionStatus.IN_PROGRESS
        else:
            statuses[partition] = None
    return PartitionStatuses(statuses, events)
