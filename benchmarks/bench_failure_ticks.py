"""The ``state_store_failures`` ticks after a status change, at 20,000 and 100,000 partitions.

    make bench-failure-ticks
    STATE_BENCH_PARTITIONS=20000,100000 STATE_BENCH_ROUNDS=2 make bench-failure-ticks

For each size, a Dagster instance on disk with SQLite storage (as ``dagster dev`` keeps it)
holding ``size`` ``state_stores`` partitions, every one materialized once (as the first
report of each store leaves them), and its status cache built (as the UI or the sensor's
earlier ticks left it). The catalog is small, SQLite (``fleet.py``: one query of
``STORES`` stores): what the tick reads of it after a change is the open problems, the
stores' names and the reports of the stores that matter, none of which follows the
partitions; the other partitions are named as stores of no query the catalog knows (a tick
treats them as the partitions of gone stores). Each round, under each read in turn (the
order alternating): a store turns broken (a problem recorded, as validation records what it
finds), the tick that requests its run (timed), that run executed here as the daemon would
launch it (not timed: its partition shows Failed), the tick that settles (timed); then the
problem resolved, the tick that requests the run recording it again, its run, and the tick
that settles. The reads: ``before``, the code before this benchmark (every partition listed,
``get_dynamic_partitions``, and their statuses from the status cache brought up to date,
``get_status_by_partition``); ``after``, the code now (``partition_status.py``). The
materializations are written by copying one real event's row in the event log's index, a
partition at a time (writing 100,000 through the API takes minutes). Then the first tick
after the cursor upgrade (a cursor without the event log's storage id), every partition
attempted by a run that failed and materialized again but one sound store's
(:func:`upgraded`): every attempt read at once (before) against a page of partitions a tick
(now), and the ticks until every page was read. Each tick with its CPU and the 1-minute
load; the ratios of the mean walls; a JSON line at the end.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from statistics import mean
from typing import Any

import sqlalchemy as sa
from dagster import (
    AssetMaterialization,
    AssetPartitionStatus,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    SensorResult,
    build_sensor_context,
)
from dagster._core.events import AssetMaterializationPlannedData
from fleet import Shape, build

from dagster_project.definitions import defs
from dagster_project.defs import sensors
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partition_status import (
    PartitionStatuses,
    store_partition_statuses,
)
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.catalog import Catalog, FoundProblem
from state_runtime.maintenance import MaintenancePolicy, StoreNames

SIZES = [int(s) for s in os.environ.get("STATE_BENCH_PARTITIONS", "20000,100000").split(",")]
ROUNDS = int(os.environ.get("STATE_BENCH_ROUNDS", "2"))
STORES = 20
Statuses = Callable[[DagsterInstance, Collection[str], int | None, str | None], PartitionStatuses]
PLANNED = DagsterEventType.ASSET_MATERIALIZATION_PLANNED
SHOWN = {AssetPartitionStatus.FAILED, AssetPartitionStatus.IN_PROGRESS}


def listed(
    instance: DagsterInstance, named: Collection[str], after: int | None, past: str | None = None
) -> PartitionStatuses:
    """The read before: every partition listed, and their statuses from the status cache."""
    partitions = instance.get_dynamic_partitions(state_stores.name or "")
    found = instance.get_status_by_partition(state_checkpoints.key, partitions, state_stores)
    statuses = {p: s if s in SHOWN else None for p, s in (found or {}).items()}
    return PartitionStatuses(statuses or dict.fromkeys(partitions), after or 0)


READS: dict[str, Statuses] = {"before": listed, "after": store_partition_statuses}


def copied(instance: DagsterInstance, partitions: list[str], report: Callable[[str], None]) -> None:
    """One real event of the first partition (``report``), its index row copied for each other
    partition, then the first's again (the newest row is the first partition's)."""
    first = partitions[0]
    report(first)
    with instance.event_log_storage.index_transaction() as conn:  # type: ignore[attr-defined]
        template = conn.execute(
            sa.text("SELECT max(id) FROM event_logs WHERE partition = :first"), {"first": first}
        ).scalar_one()
    copy = sa.text(
        "INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, step_key, "
        "asset_key, partition) SELECT run_id, replace(event, :was, :now), dagster_event_type, "
        "timestamp, step_key, asset_key, :partition FROM event_logs WHERE id = :template"
    )
    rows = [
        {"was": json.dumps(first), "now": json.dumps(p), "partition": p, "template": template}
        for p in partitions[1:]
    ]
    with instance.event_log_storage.index_transaction() as conn:  # type: ignore[attr-defined]
        conn.execute(copy, rows)
    report(first)


def attempt_all(instance: DagsterInstance, partitions: list[str]) -> None:
    """An attempt of each partition (a run planned to materialize it, as a backfill leaves
    them), all of one run that failed: the past a cursor from before the upgrade reads."""
    job = defs.resolve_job_def("state_store_record_job")
    run = instance.create_run_for_job(job_def=job)
    instance.report_run_failed(run)

    def planned(partition: str) -> None:
        data = AssetMaterializationPlannedData(state_checkpoints.key, partition=partition)
        event = DagsterEvent(PLANNED.value, job.name, event_specific_data=data)
        instance.report_dagster_event(event, run.run_id)

    copied(instance, partitions, planned)


def materialize_all(instance: DagsterInstance, partitions: list[str]) -> None:
    """A materialization of each partition (after its attempt)."""
    copied(
        instance,
        partitions,
        lambda p: instance.report_runless_asset_event(
            AssetMaterialization(state_checkpoints.key, partition=p)
        ),
    )


def every_attempt(
    instance: DagsterInstance, named: Collection[str], after: int | None, past: str | None = None
) -> PartitionStatuses:
    """The first read after the upgrade before: every attempt ever made grouped by partition
    in one tick, and the statuses of those partitions."""
    storage = instance.event_log_storage
    events = storage.get_maximum_record_id() or 0
    attempted = storage.get_latest_storage_id_by_partition(state_checkpoints.key, PLANNED)
    found = store_partition_statuses(instance, {*named, *attempted}, events)
    return PartitionStatuses(found.statuses, found.events)


def upgraded(ticks: Ticks, partitions: list[str], failed: str) -> dict[str, Any]:
    """The first tick of a cursor from before the upgrade (no storage id), every partition
    attempted by a run that failed, then materialized again but ``failed`` (a sound store's:
    Failed before the upgrade), alternated ``ROUNDS`` times: every attempt read in one tick
    (before), a page of ``PAST_A_READ`` partitions (now); then how many ticks the pages
    take, and the tick that finds ``failed`` and requests the run that records it again."""
    attempt_all(ticks.instance, partitions)
    materialize_all(ticks.instance, [p for p in partitions if p != failed])
    before = json.dumps({"failed": [], "census": None, "shown": []})
    walls: dict[str, list[float]] = {"before": [], "now": []}
    reads: dict[str, Statuses] = {"before": every_attempt, "now": store_partition_statuses}
    for round_ in range(ROUNDS):
        for name in list(reads) if round_ % 2 == 0 else list(reads)[::-1]:
            ticks.cursor = before
            result, wall, cpu = ticks.tick(reads[name])
            walls[name].append(wall)
            print(
                f"    {name}, first tick after the upgrade: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                f"{len(result.run_requests or [])} runs (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    ticks.cursor, pages, found = before, [], None
    while not pages or json.loads(ticks.cursor or "{}").get("past"):
        result, wall, _ = ticks.tick(store_partition_statuses)
        pages.append(wall)
        if found is None and [r.partition_key for r in result.run_requests or []] == [failed]:
            found = len(pages)
    print(
        f"    now: the past read in {len(pages)} ticks of {mean(pages):.2f} s on average, "
        f"at most {max(pages):.2f} s; {failed} found Failed at tick {found} "
        f"(load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    assert found is not None
    return {"first": walls, "pages": pages, "found_at": found}


class Ticks:
    """The failures sensor's ticks on one instance and catalog, its cursor kept."""

    def __init__(self, instance: DagsterInstance, url: str) -> None:
        self.instance, self.cursor = instance, None
        self.resources = {
            "maintenance": MaintenanceResource.of(MaintenancePolicy(), catalog_url=url)
        }
        self.job = defs.resolve_job_def("state_store_record_job")

    def tick(self, read: Statuses) -> tuple[SensorResult, float, float]:
        """One tick under ``read``: its result, wall and CPU seconds."""
        original = sensors.store_partition_statuses
        sensors.store_partition_statuses = read  # type: ignore[assignment]
        try:
            context = build_sensor_context(
                instance=self.instance, resources=self.resources, cursor=self.cursor
            )
            started, cpu = time.perf_counter(), time.process_time()
            result = sensors.store_failure_sensor(context)
            wall, used = time.perf_counter() - started, time.process_time() - cpu
        finally:
            sensors.store_partition_statuses = original  # type: ignore[assignment]
        assert isinstance(result, SensorResult)
        self.cursor = result.cursor
        return result, wall, used

    def run(self, result: SensorResult) -> list[str]:
        """The runs a tick requested, executed as the daemon launches them: their partitions."""
        for request in result.run_requests or []:
            self.job.execute_in_process(
                instance=self.instance,
                resources=self.resources,
                partition_key=request.partition_key,
                raise_on_error=False,
            )
        return [r.partition_key or "" for r in result.run_requests or []]


def change(ticks: Ticks, read: Statuses, label: str, expected: str) -> dict[str, float]:
    """The tick that requests the run on ``expected`` after a change, the run, and the tick
    that settles, each timed with the load."""
    figures = {}
    result, wall, cpu = ticks.tick(read)
    figures["requesting"] = wall
    requested = ticks.run(result)
    print(
        f"    {label}, requesting tick: {wall:.2f} s wall, {cpu:.2f} s CPU, runs {requested}"
        f" (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    assert requested == [expected], requested
    result, wall, cpu = ticks.tick(read)
    figures["settling"] = wall
    print(
        f"    {label}, settling tick: {wall:.2f} s wall, {cpu:.2f} s CPU, "
        f"{len(result.run_requests or [])} runs (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    assert not result.run_requests
    return figures


def bench(size: int, folder: Path, url: str) -> dict[str, Any]:
    catalog = Catalog.open(url)
    names = StoreNames.of(catalog)
    stores = sorted(names.name(r.key) for r in catalog.stores())
    others = [f"gone-{i:06d}/0/0/default" for i in range(size - len(stores))]
    home = folder / f"dagster_home_{size}"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.local_temp(str(home))
    started = time.perf_counter()
    instance.add_dynamic_partitions(state_stores.name or "", [*others, *stores])
    materialize_all(instance, [*others, *stores])
    listed(instance, (), None)  # the status cache built, as the UI or the earlier ticks left it
    print(
        f"{size:,} partitions ({len(stores)} stores in the catalog) ready in "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )
    ticks = Ticks(instance, url)
    ticks.tick(store_partition_statuses)  # the first tick: its cursor
    broken = stores[-1]
    walls: dict[str, dict[str, list[float]]] = {r: {} for r in READS}
    for round_ in range(ROUNDS):
        order = list(READS) if round_ % 2 == 0 else list(READS)[::-1]
        for name in order:
            catalog.add_problems(names.key(broken), [FoundProblem("bench: a file found damaged")])
            for kind, wall in change(ticks, READS[name], f"{name}, broken", broken).items():
                walls[name].setdefault(f"broken, {kind}", []).append(wall)
            catalog.resolve_problems(names.key(broken), "bench: restored")
            for kind, wall in change(ticks, READS[name], f"{name}, sound", broken).items():
                walls[name].setdefault(f"sound, {kind}", []).append(wall)
    first = upgraded(ticks, [*others, *stores], stores[0])
    catalog.close()
    instance.dispose()
    for kind in walls["before"]:
        before, after = mean(walls["before"][kind]), mean(walls["after"][kind])
        print(
            f"  {size:,}: {kind} tick {before:.2f} s before, {after:.2f} s after "
            f"({before / after:.1f}x)",
            flush=True,
        )
    return {
        "partitions": size,
        "walls": walls,
        "upgrade": first,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-failure-ticks-") as folder:
        url = f"sqlite:///{folder}/catalog.db"
        Catalog.open(url, upgrade=True).close()
        build(url, Path(folder) / "fleet", Shape(queries=1, partitions=STORES, versions=3))
        results = [bench(size, Path(folder), url) for size in SIZES]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
