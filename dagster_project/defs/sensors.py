"""Sensors: one partition per store (discovered from the catalog; it only observes, so it runs
from the start), what happened outside Dagster (``catalog_events.py``; it only reports, so it
runs from the start), the broken stores' partitions failed and recorded again once sound (it
only reads the catalog, so it runs from the start), and snapshots on demand (it writes:
STOPPED until turned on, see ``automation.py``)."""

import hashlib
import json
from dataclasses import dataclass

from dagster import (
    AssetPartitionStatus,
    DefaultSensorStatus,
    RunConfig,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_project.defs.assets import StoresConfig
from dagster_project.defs.automation import sensor_status
from dagster_project.defs.catalog_events import catalog_events_sensor
from dagster_project.defs.jobs import snapshot_job, store_record_job
from dagster_project.defs.partition_status import store_partition_statuses
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.store_events import partition_runs
from state_runtime.catalog import StoreKey
from state_runtime.errors import InvalidArgument
from state_runtime.maintenance import StoreNames, StoreStatus, due_for_snapshot, store_reports


@sensor(
    name="state_store_discovery",
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Adds a state_stores partition for each store in the catalog (named "
        "<query>/<operator>/<partition>/<store>), drops gone ones and those of an older name."
    ),
)
def store_discovery_sensor(
    context: SensorEvaluationContext, maintenance: MaintenanceResource
) -> SensorResult:
    """A tick reads what the stores' names follow (``Catalog.names_mark``: the stores' count
    and newest id, the roots, the (root, query) pairs' count and newest id; its digest is the
    cursor): only when it changed
    does it list the stores and Dagster's partitions. A store whose label changed (its root
    relocated, another query committing below it) gets its new partition, and the old one is
    deleted, logged by name: Dagster cannot rename a partition, the old one's runs and events
    stay in the asset's history, and the failures sensor names the store by its new one."""
    with maintenance.fleet("dagster:discovery") as fleet:
        mark = fleet.catalog.names_mark()
        cursor = hashlib.sha256(json.dumps(mark).encode()).hexdigest()[:32]
        if cursor == context.cursor:
            return SensorResult(
                skip_reason=SkipReason("no store added, removed or renamed"), cursor=cursor
            )
        records = fleet.stores()
        names = StoreNames.current(fleet.catalog)
        stores = {names.name(record.key) for record in records}
    known = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
    added, gone = sorted(stores - known), sorted(known - stores)
    if not added and not gone:
        return SensorResult(
            skip_reason=SkipReason(f"{len(known)} stores, no change"), cursor=cursor
        )
    context.log.info(f"stores: {len(added)} new, {len(gone)} gone")
    if gone:
        shown = ", ".join(gone[:20]) + (f" and {len(gone) - 20} more" if len(gone) > 20 else "")
        context.log.info(f"partitions deleted (store gone or renamed; history kept): {shown}")
    return SensorResult(
        dynamic_partitions_requests=[
            *([state_stores.build_add_request(added)] if added else []),
            *([state_stores.build_delete_request(gone)] if gone else []),
        ],
        cursor=cursor,
    )


@sensor(
    name="state_snapshot_due",
    job=snapshot_job,
    minimum_interval_seconds=120,
    default_status=sensor_status("state_snapshot_due"),
    description="Requests a snapshot run for the stores whose chains passed the threshold.",
)
def snapshot_due_sensor(
    context: SensorEvaluationContext, maintenance: MaintenanceResource
) -> RunRequest | SkipReason:
    policy = maintenance.policy()
    with maintenance.fleet("dagster:snapshot-sensor") as fleet:
        due = due_for_snapshot(fleet, policy)
        if not due:
            return SkipReason("no store is due for a snapshot")
        names = StoreNames.current(fleet.catalog)
    stores = sorted(names.name(d.record.key) for d in due)
    # one run per set of (store, latest version): the same chains never trigger twice
    state = ",".join(f"{d.record.key}@{d.record.latest.version}" for d in due)
    return RunRequest(
        run_key=hashlib.sha256(state.encode()).hexdigest()[:32],
        run_config=RunConfig(ops={"state_snapshots": StoresConfig(stores=stores)}),
        tags={"state_runtime/due_stores": str(len(stores))},
    )


def _key(names: StoreNames, name: str) -> StoreKey | None:
    """The store of a partition, None for a partition of no store the catalog names (one
    gone: discovery deletes its partition)."""
    try:
        return names.key(name)
    except InvalidArgument:
        return None


@dataclass(frozen=True)
class FailuresCursor:
    """The partitions of the stores broken at the last full tick, and the catalog's census of
    open problems then (their count and newest id; None: read everything, as the first tick
    does); the partitions Dagster showed *Failed* or in progress then, and the event log's
    newest storage id (None: read from the newest on, every partition then asked about a page
    a tick) and the page cursor of those not asked about yet (``partition_status.py``).
    ``shown`` holds existing partitions only (a gone store's is dropped once discovery deletes
    it), each one *Failed* until a run materializes it (the tick requests one when its store
    is sound), so it is bounded by the partitions Dagster shows *Failed* or in progress."""

    failed: list[str]
    census: list[int] | None
    shown: list[str]
    events: int | None
    past: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> "FailuresCursor":
        found = json.loads(text or "[]")
        if isinstance(found, list):  # the cursor before the problems were kept
            return cls(found, None, [], None)
        # older cursors: the problems' ids (not a census), no statuses kept
        return cls(
            found["failed"],
            found.get("census"),
            found.get("shown", []),
            found.get("events"),
            found.get("past"),
        )


@sensor(
    name="state_store_failures",
    job=store_record_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Fails the partition of each store the catalog says is broken (a state_store_record_job "
        "run on it, which fails), whoever validated, and records it again (a run that "
        "materializes it) once the store is no longer broken: the partition shows Failed, with "
        "the status and reason as its latest metadata, exactly while the store is broken."
    ),
)
def store_failure_sensor(
    context: SensorEvaluationContext, maintenance: MaintenanceResource
) -> SensorResult:
    """The stores the catalog says are broken (as ``statestore health`` does) against their
    partitions' status in Dagster: a run for each one not Failed yet, and one for each failed
    partition whose store is no longer broken (``store_events.py``). A store is broken while it
    has open problems: a tick reads their count and newest id (one row, whatever the fleet), and
    only when they changed since the last tick (the cursor keeps them, and the partitions of
    the stores broken then) does it read the reports and Dagster's statuses of the stores that
    matter: those with open problems, and those whose partitions failed (in the cursor or in
    Dagster, ``partition_status.py``). Not the fleet's: at 100,000 stores a tick read every
    store's report to find one broken store, and listing the partitions and their statuses
    took 8 s of a tick."""
    before = FailuresCursor.parse(context.cursor)
    with maintenance.fleet("dagster:store-failures") as fleet:
        census = list(fleet.catalog.problem_census())
        if before.census == census and before.past is None:
            skip = SkipReason(f"{census[0]} open problems, none new or resolved")
            return SensorResult(skip_reason=skip, cursor=context.cursor)
        names = StoreNames.current(fleet.catalog)
        problems = {p.key for p in fleet.catalog.problems()}
        shown = store_partition_statuses(
            context.instance,
            {*(names.name(key) for key in problems), *before.failed, *before.shown},
            before.events,
            before.past,
        )
        statuses = shown.statuses
        failed = {n for n, s in statuses.items() if s is AssetPartitionStatus.FAILED}
        wanted = problems | {
            key for key in (_key(names, n) for n in failed | set(before.failed)) if key
        }
        reports = store_reports(fleet, maintenance.policy(), only=wanted) if wanted else []
    runs = partition_runs(reports, names, statuses, before.failed)
    # the problems are settled once every broken store's partition (discovered: it may not be
    # yet) shows Failed and only theirs: until then, read everything again
    broken = sum(1 for r in reports if r.status.status is StoreStatus.BROKEN)
    done = not runs.fail and not runs.clear and len(runs.failed) == broken
    settled = census if done else before.census
    cursor = json.dumps(
        {
            "failed": runs.failed,
            "census": settled,
            "shown": shown.shown,
            "events": shown.events,
            "past": shown.past,
        }
    )
    if not runs.fail and not runs.clear:
        skip = SkipReason("every broken store's partition shows Failed, and only theirs")
        return SensorResult(skip_reason=skip, cursor=cursor)
    return SensorResult(
        run_requests=[
            # one run per store and status spell: the same breakage (or recovery) runs once
            RunRequest(
                run_key=f"{name}@{report.status.status.value}@{report.status.since}",
                partition_key=name,
            )
            for name, report in [*runs.fail, *runs.clear]
        ],
        cursor=cursor,
    )


sensors = [store_discovery_sensor, snapshot_due_sensor, catalog_events_sensor, store_failure_sensor]
