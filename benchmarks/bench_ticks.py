"""Each sensor's tick at fleet size, quiet and with a minute's batches (issue 35).

    make bench-ticks                                  # 20,000 stores
    STATE_BENCH_TICK_SIZES=2000,100000 make bench-ticks
    STATE_BENCH_FLEET_MINUTE=2000                     # batches' metrics a minute

For each size, the fleet of ``bench_fleet.py`` (``fleet.py``: ``size / 200`` queries x 200
stores, PostgreSQL) and a Dagster instance on PostgreSQL, the sensors' first ticks run
untimed (the discovery sensor adds every store's partition). Then, timed as the daemon calls
them: ``ROUNDS`` quiet ticks of each sensor (nothing changed since its last), and ``2 x
ROUNDS`` ticks of ``state_catalog_events`` each after a minute of batches' metrics
(``MINUTE``, over the queries in turn), with the events that tick wrote to Dagster's event
log: alternately as before (the stores' names read in full each tick: the process's kept
names dropped first) and now (kept between ticks while the catalog's ``names_mark`` holds,
``StoreNames.current``), on the same fleet and instance, and the ratio of their mean walls.

Then the ticks after a status change. A store turns broken (a problem recorded on the fleet's
last store, as validation records what it finds): the ``failures`` tick, which must request a
run on that store's partition, that run executed in this process as the daemon launches it
(its partition must then show Failed: read back from Dagster), and the next ``failures`` tick
(it settles); beside them, what such a tick read before it read the broken stores' reports
alone (every store's report, timed once). A snapshot pass over the first ``SNAPSHOT_QUERIES``
queries' stores (every one with 2 deltas or more since its snapshot: their snapshot versions
change), after their state was reported as the report run reports it: the
``state_catalog_events`` tick, which must request one report run, and the events that report
writes for those stores (their state's changes, not their snapshot versions':
``store_events.state_fingerprint``) beside the stores whose snapshot moved. Each figure with
the load average; a JSON line at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from bench_fleet import (
    DATABASE,
    MINUTE,
    PER_STORE_CHECKS,
    POLICY,
    SERVER,
    Cycle,
    built_cycle,
    load,
    measured,
)
from dagster import AssetPartitionStatus, DagsterInstance
from dagster._core.test_utils import instance_for_test
from fleet import Shape
from fresh_database import fresh_database

from dagster_project.definitions import defs
from dagster_project.defs import catalog_events, sensors
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores
from state_runtime.catalog import Catalog, FoundProblem
from state_runtime.maintenance import (
    Fleet,
    HealthSpool,
    StoreNames,
    snapshot_pass,
    store_names,
    store_report_pages,
    store_reports,
)

SIZES = [int(s) for s in os.environ.get("STATE_BENCH_TICK_SIZES", "20000").split(",")]
ROUNDS = 3
SNAPSHOT_QUERIES = 10  # the snapshot pass's scope: at most these queries' stores
SENSORS = ("discovery", "failures", "state_catalog_events")
RULES = [  # the stores' names: read in full each tick (before), kept between ticks (now)
    ("names read each tick", False),
    ("names kept between ticks", True),
]


def batch_events(dagster_url: str) -> int:
    """The ``state_batch_metrics`` events in Dagster's event log."""
    engine = sa.create_engine(dagster_url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    sa.text("SELECT count(*) FROM event_logs WHERE asset_key LIKE :key"),
                    {"key": "%state_batch_metrics%"},
                ).scalar_one()
            )
    finally:
        engine.dispose()


class Spent:
    """Wall seconds spent in each of the tick's reads and writes, by wrapping them where they
    are defined: the catalog's pages of batches, its roots' queries (the stores' names) and
    the stores' reports (the failures sensor's), Dagster's newest batch event, its event-log
    writes, its store partitions and their statuses."""

    def __init__(self, storage: type) -> None:
        self.seconds: dict[str, float] = {}
        self.wrapped: list[tuple[Any, str, str]] = [
            (next(k for k in owner.__mro__ if name in k.__dict__), name, label)
            for owner, name, label in [
                (Catalog, "batch_metrics_after", "catalog: batches"),
                (Catalog, "root_queries", "catalog: names"),
                (Catalog, "names_mark", "catalog: names mark"),
                (storage, "store_event_batch", "dagster: writes"),
                (DagsterInstance, "get_dynamic_partitions", "dagster: partitions"),
            ]
        ]
        self.wrapped.append((catalog_events, "reported_through", "dagster: newest event"))
        self.wrapped.append((sensors, "store_reports", "catalog: reports"))
        self.wrapped.append((sensors, "store_partition_statuses", "dagster: statuses"))
        self.originals = [owner.__dict__[name] for owner, name, _ in self.wrapped]

    def __enter__(self) -> Spent:
        for (owner, name, label), original in zip(self.wrapped, self.originals, strict=True):
            setattr(owner, name, self._timed(label, original))
        return self

    def __exit__(self, *_: object) -> None:
        for (owner, name, _), original in zip(self.wrapped, self.originals, strict=True):
            setattr(owner, name, original)

    def _timed(self, label: str, original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.seconds[label] = self.seconds.get(label, 0.0) + spent

        return timed


Timed = Callable[..., None]


def broken_store(cycle: Cycle, timed: Timed) -> dict[str, Any]:
    """The fleet's last store turns broken: the failures tick requests a run on its partition
    alone, that run (executed as the daemon launches it) leaves the partition Failed, and the
    next tick settles."""
    names = StoreNames.of(cycle.catalog)
    name = max(cycle.instance.get_dynamic_partitions(state_stores.name or ""))
    cycle.catalog.add_problems(names.key(name), [FoundProblem("bench: a file found damaged")])
    timed("tick after a store turned broken: failures", cycle, "failures")
    requests = cycle.results["failures"].run_requests or []
    named = [r.partition_key for r in requests]
    job = defs.resolve_job_def("state_store_record_job")
    for request in requests:
        assert request.partition_key is not None
        run = measured(
            f"the requested run on {request.partition_key} (not a tick)",
            lambda key=request.partition_key: (
                str(
                    job.execute_in_process(
                        instance=cycle.instance,
                        resources={"maintenance": cycle.maintenance},
                        partition_key=key,
                        raise_on_error=False,
                    ).success
                ),
                None,
            ),
        )
        print(f"    run succeeded: {run.result}", flush=True)
    status = (
        cycle.instance.get_status_by_partition(state_checkpoints.key, [name], state_stores) or {}
    ).get(name)
    shown = status is AssetPartitionStatus.FAILED
    print(f"  {name}: runs requested for {named}; its partition shows {status}", flush=True)
    assert named == [name] and shown, (named, status)
    timed("tick after the run failed: failures", cycle, "failures")
    before = measured(
        "baseline: the fleet's reports, what such a tick read before (not a tick)",
        lambda: (f"{len(store_reports(cycle.fleet, POLICY)):,} stores", None),
    )
    return {"store": name, "runs_requested": named, "status": str(status), "before": before.wall}


def snapshots_moved(cycle: Cycle, timed: Timed) -> dict[str, Any]:
    """A snapshot pass over the first ``SNAPSHOT_QUERIES`` queries' stores after their state
    was reported: the ``state_catalog_events`` tick requests one report run, and that report
    writes their state's changes (``Cycle.events``: the code location's own), beside the stores
    whose snapshot moved."""
    roots = cycle.roots[: min(SNAPSHOT_QUERIES, max(1, cycle.shape.queries - 1))]
    scope = Fleet(cycle.catalog, roots=roots, owner="bench-ticks")

    def reported() -> int:
        return cycle.events(HealthSpool.of(store_report_pages(scope, POLICY)), PER_STORE_CHECKS)

    print(f"  their state reported first: {reported():,} events", flush=True)
    written = snapshot_pass(scope, replace(POLICY, snapshot_min_deltas=2)).counts()["written"]
    print(f"  snapshot pass over {len(roots)} queries: {written:,} written", flush=True)
    timed(f"tick after {written:,} snapshots: state_catalog_events", cycle, SENSORS[2])
    requests = len(cycle.results[SENSORS[2]].run_requests or [])
    events = reported()
    print(
        f"  {requests} report run requested; its events for these stores: {events:,} "
        f"({cycle.moved:,} stores' snapshot or latest version moved)",
        flush=True,
    )
    assert requests == 1 and cycle.moved >= written, (requests, cycle.moved, written)
    return {"snapshots": written, "report_runs": requests, "events": events, "moved": cycle.moved}


def bench(size: int) -> dict[str, Any]:
    shape = Shape(queries=max(1, size // 200))
    folder = Path(tempfile.mkdtemp(prefix="bench-ticks-"))
    rows: list[dict[str, Any]] = []

    def timed(step: str, cycle: Cycle, sensor: str, events: str | None = None) -> None:
        before = batch_events(events) if events else 0
        with Spent(type(cycle.instance.event_log_storage)) as spent:
            found = measured(step, lambda: (cycle.tick(sensor), None))
        written = batch_events(events) - before if events else 0
        parts = {label: round(seconds, 2) for label, seconds in spent.seconds.items()}
        rows.append(
            {"step": step, "wall": round(found.wall, 2), "cpu": round(found.cpu, 2)}
            | {"events": written, "result": found.result, "load": load(), "spent": parts}
        )
        print(f"    {written:,} batch events written, load {load()}; {parts}", flush=True)

    try:
        with (
            fresh_database(SERVER, DATABASE) as url,
            fresh_database(SERVER, f"{DATABASE}_dagster") as dagster_url,
            instance_for_test(
                overrides={"storage": {"postgres": {"postgres_url": dagster_url}}}
            ) as instance,
        ):
            cycle, _ = built_cycle(url, folder, shape, instance)
            for sensor in SENSORS:  # the first ticks: partitions added, the first report
                print(f"  first tick of {sensor}: {cycle.tick(sensor)}", flush=True)
            for _ in range(ROUNDS):
                for sensor in SENSORS:
                    timed(f"quiet tick: {sensor}", cycle, sensor)
            for minute in range(2 * ROUNDS):  # alternated, the old rule first
                rule = RULES[minute % 2]
                if not rule[1]:
                    store_names._HELD.clear()
                cycle.minute_of_batches(minute)
                step = f"tick after {MINUTE:,} batches, {rule[0]}"
                timed(step, cycle, SENSORS[2], dagster_url)
            changes = {
                "broken": broken_store(cycle, timed),
                "snapshots": snapshots_moved(cycle, timed),
            }
            cycle.catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    walls = [[row["wall"] for row in rows if row["step"].endswith(name)] for name, _ in RULES]
    ratio = round(sum(walls[0]) / max(sum(walls[1]), 1e-9), 2)
    print(f"  batch ticks, names read each tick / kept: {ratio}x the wall", flush=True)
    return {
        "stores": shape.stores,
        "queries": shape.queries,
        "ticks": rows,
        "ratio": ratio,
        "changes": changes,
    }


def main() -> None:
    print(f"{os.cpu_count()} CPUs, load {load()}", flush=True)
    print(json.dumps({"sizes": [bench(size) for size in SIZES]}))


if __name__ == "__main__":
    main()
