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
attempt ever made at once took 14 s at 40,000 partitions attempted (Dagster on SQLite). So
that past, the attempts up to the newest id at the first read (``Past``), is read oldest
first, ``PAST_A_READ`` attempts a read (one index range of the event log), a read each tick
beside the new attempts, until it is read: each tick stays bounded, and a partition another
run failed before the upgrade is found within ``attempts / PAST_A_READ`` ticks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from dagster import (
    AssetPartitionStatus,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    EventRecordsFilter,
    RunsFilter,
)
from dagster._core.storage.event_log import SqlEventLogStorage, SqlEventLogStorageTable

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores

RUNS_A_READ = 100  # run ids a runs query names, as the status cache reads them
PAST_A_READ = 2_000  # attempts from before the first read, read a tick until none is left
PLANNED = DagsterEventType.ASSET_MATERIALIZATION_PLANNED


@dataclass(frozen=True)
class Past:
    """The attempts from before the first read still to read: storage ids after ``after`` up
    to ``until`` (the newest id at the first read)."""

    after: int
    until: int

    def pair(self) -> list[int]:
        return [self.after, self.until]


def past_attempts(instance: DagsterInstance, past: Past) -> tuple[set[str], Past | None]:
    """The partitions of the next ``PAST_A_READ`` attempts of ``past`` (oldest first), and
    what is left of it (None: read): their storage ids and partitions alone, from the event
    log's index by asset, type and id (Dagster's record reads deserialize each event: 4 s for
    5,000 under load)."""
    events = SqlEventLogStorageTable.c
    query = (
        sa.select(events.id, events.partition)
        .where(
            events.asset_key == state_checkpoints.key.to_string(),
            events.dagster_event_type == PLANNED.value,
            events.id > past.after,
            events.id <= past.until,
        )
        .order_by(events.id)
        .limit(PAST_A_READ)
    )
    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):  # Dagster's SQLite, PostgreSQL, MySQL are
        raise TypeError(f"the failures sensor reads an SQL event log, not {type(storage)}")
    with storage.index_connection() as connection:
        rows = connection.execute(query).all()
    partitions = {partition for _, partition in rows if partition}
    if len(rows) < PAST_A_READ:
        return partitions, None
    return partitions, Past(rows[-1][0], past.until)


@dataclass(frozen=True)
class PartitionStatuses:
    """Each partition asked about or attempted since the last read that exists, with its
    status (None: neither failed nor in progress, whether materialized or not), and the event
    log's newest storage id when read: where the next read starts. A partition deleted (its
    store gone) is dropped by the membership check, so ``shown`` holds no more than the
    existing partitions Dagster shows *Failed* or in progress."""

    statuses: dict[str, AssetPartitionStatus | None]
    events: int
    past: Past | None = None
    """The attempts from before the first read not read yet (None: none left)."""

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
    instance: DagsterInstance, named: Collection[str], after: int | None, past: Past | None = None
) -> PartitionStatuses:
    """The statuses of the partitions ``named``, of those attempted after storage id ``after``
    and of those of the next page of ``past``; ``after`` None (the first read): from the
    newest id, with every attempt up to it the past to read."""
    storage, key = instance.event_log_storage, state_checkpoints.key
    events = storage.get_maximum_record_id() or 0
    if after is None:
        after, past = events, Past(0, events)
    attempted = set(storage.get_latest_storage_id_by_partition(key, PLANNED, after_cursor=after))
    if past is not None:
        older, past = past_attempts(instance, past)
        attempted |= older
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
