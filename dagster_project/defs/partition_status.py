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
them alone); where the attempt is the later, that partition's attempts since its latest
materialization (one read over those partitions alone) and their runs decide, by the rule of
Dagster's status cache, which keeps a partition *Failed* until something materializes it:
in progress while the latest one runs (shown before *Failed*, as the UI does), else *Failed*
if any of them failed (a later one canceled or deleted does not clear it).

The first read of a cursor without a storage id (``after`` None: the first tick, or the first
after the upgrade that added it) must still find the partitions other runs failed before it
(the read before the upgrade found them by listing every status; starting at the newest id
would miss a sound store's partition failed before the upgrade by another run). Reading every
attempt ever made at once took 14 s at 40,000 partitions attempted (Dagster on SQLite),
every one of them then read as above. So from the newest id on the attempts are read as
always, and every partition is asked about once more, ``PAST_A_READ`` a read in Dagster's
order (its page cursor kept), until each was: each tick stays bounded, and a partition
another run failed before the upgrade is found within ``partitions / PAST_A_READ`` ticks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dagster import (
    AssetPartitionStatus,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    EventRecordsFilter,
    RunsFilter,
)

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores

RUNS_A_READ = 100  # run ids a runs query names, as the status cache reads them
PAST_A_READ = 2_000  # partitions asked about a tick after the first read until each was
PLANNED = DagsterEventType.ASSET_MATERIALIZATION_PLANNED


def past_partitions(instance: DagsterInstance, past: str) -> tuple[list[str], str | None]:
    """The next ``PAST_A_READ`` store partitions after Dagster's page cursor ``past`` (""
    from the first), oldest first, and the cursor of the page after them (None: none left)."""
    found = instance.get_paginated_dynamic_partitions(
        state_stores.name or "", limit=PAST_A_READ, ascending=True, cursor=past or None
    )
    return list(found.results), found.cursor if found.has_more else None


@dataclass(frozen=True)
class PartitionStatuses:
    """Each partition asked about or attempted since the last read that exists, with its
    status (None: neither failed nor in progress, whether materialized or not), and the event
    log's newest storage id when read: where the next read starts. A partition deleted (its
    store gone) is dropped by the membership check, so ``shown`` holds no more than the
    existing partitions Dagster shows *Failed* or in progress."""

    statuses: dict[str, AssetPartitionStatus | None]
    events: int
    past: str | None = None
    """The page cursor of the partitions not asked about yet since the first read (None:
    none left)."""

    @property
    def shown(self) -> list[str]:
        """The partitions Dagster shows *Failed* or in progress: asked about again next read."""
        return [p for p, status in self.statuses.items() if status is not None]


def runs_of(instance: DagsterInstance, run_ids: Collection[str]) -> dict[str, DagsterRun]:
    """The runs named that still exist (a deleted one is neither failed nor in progress)."""
    ids = sorted(run_ids)
    found: dict[str, DagsterRun] = {}
    for start in range(0, len(ids), RUNS_A_READ):
        chunk = ids[start : start + RUNS_A_READ]
        found |= {r.run_id: r for r in instance.get_runs(RunsFilter(run_ids=chunk))}
    return found


def store_partition_statuses(
    instance: DagsterInstance, named: Collection[str], after: int | None, past: str | None = None
) -> PartitionStatuses:
    """The statuses of the partitions ``named``, of those attempted after storage id ``after``
    and of the next page of partitions after ``past``; ``after`` None (the first read): the
    attempts from the newest id on, every partition then asked about a page a read."""
    storage, key = instance.event_log_storage, state_checkpoints.key
    events = storage.get_maximum_record_id() or 0
    if after is None:
        after, past = events, ""
    attempted = set(storage.get_latest_storage_id_by_partition(key, PLANNED, after_cursor=after))
    if past is not None:
        older, past = past_partitions(instance, past)
        attempted |= set(older)
    existing = instance.get_existing_dynamic_partitions(
        state_stores.name or "", sorted({*named, *attempted})
    )
    if not existing:
        return PartitionStatuses({}, events, past)
    latest = storage.get_latest_storage_id_by_partition(key, PLANNED, partitions=set(existing))
    done = storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, partitions=set(existing)
    )
    since = {p: done.get(p, 0) for p, i in latest.items() if i > done.get(p, 0)}
    attempts = unmaterialized_attempts(instance, since)
    runs = runs_of(instance, {run for tried in attempts.values() for run in tried})
    statuses: dict[str, AssetPartitionStatus | None] = {}
    for partition in sorted(existing):
        tried = [runs[run] for run in attempts.get(partition, []) if run in runs]
        last = runs.get(attempts[partition][-1]) if partition in attempts else None
        if last is not None and not last.is_finished:
            statuses[partition] = AssetPartitionStatus.IN_PROGRESS
        elif any(run.status is DagsterRunStatus.FAILURE for run in tried):
            statuses[partition] = AssetPartitionStatus.FAILED
        else:
            statuses[partition] = None
    return PartitionStatuses(statuses, events, past)


def unmaterialized_attempts(
    instance: DagsterInstance, since: Mapping[str, int]
) -> dict[str, list[str]]:
    """The runs of each partition's attempts after its storage id in ``since``, oldest first:
    one read of the attempts of those partitions after the smallest such id, filtered per
    partition."""
    if not since:
        return {}
    records = instance.event_log_storage.get_event_records(
        EventRecordsFilter(
            PLANNED,
            asset_key=state_checkpoints.key,
            asset_partitions=sorted(since),
            after_cursor=min(since.values()),
        ),
        ascending=True,
    )
    attempts: dict[str, list[str]] = {}
    for record in records:
        partition = record.partition_key or ""
        if record.storage_id > since.get(partition, record.storage_id):
            attempts.setdefault(partition, []).append(record.run_id)
    return attempts
