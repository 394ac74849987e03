"""A steady-state hourly maintenance cycle at fleet size (issue 35).

    make bench-fleet                                     # 2,000 and 20,000 stores
    STATE_BENCH_FLEET_SIZES=100000 make bench-fleet      # 500 queries x 200 partitions
    STATE_BENCH_FLEET_HOUR=4                             # batches per store in the hour
    STATE_BENCH_FLEET_MINUTE=2000                        # batches' metrics before the ticks

For each size, a fleet of ``size / 200`` queries x 200 partitions (``fleet.py``: 12 versions of
tiny deltas per store through the store and ``commit_batch``, snapshots staggered by
partition, every file verified) in a fresh PostgreSQL catalog, and a Dagster instance on
PostgreSQL (its own database). The previous hour's maintenance is run first, untimed: a
cleanup of the history, a validation, every store's state and checks reported to Dagster, one
tick of each sensor.
Then one hour of new batches (``STATE_BENCH_FLEET_HOUR`` per store) and the cycle, each pass
through its public function, in this process, with the policy's default workers:

- snapshots: the stores due (``snapshot_pass``);
- validation: the hour's new files (``run_checks``, the library's default policy);
- cleanup, executed (``cleanup_pass``; retention window 0: what the new snapshots free);
- health (``store_report_pages``, spooled as the health asset reads it).

Each pass's wall time, CPU time (every thread of this process and of the worker processes
below it; the PostgreSQL server's not counted) and peak resident memory (this process's
high-water mark, reset before it, plus each worker process's), and the Dagster events that
pass would write: the validation's and health's through the code location's own
``changed_store_events`` (each store whose state or per-store check changed, plus the
fleet's), one materialization for the snapshot and cleanup assets. Then one tick of each
sensor (discovery, failures, ``state_catalog_events``) timed against the fleet, as the
daemon calls them; before them, ``STATE_BENCH_FLEET_MINUTE`` batches' metrics recorded over
the queries (issue 35: 2,000 a minute), which the ``state_catalog_events`` tick reports to
Dagster. A table per size, then one JSON line with every figure; ``--plot PATH`` draws the
passes per size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from dagster import AddDynamicPartitionsRequest, DagsterInstance, SensorResult, build_sensor_context
from dagster._core.test_utils import instance_for_test
from fleet import Shape, advance, build, query_id, query_storage
from fresh_database import fresh_database
from peak_memory import peak_rss
from process_tree import TreeSampler, tree_cpu
from rich.console import Console
from rich.table import Table

from dagster_project.defs.catalog_events import Cursor, catalog_events_sensor
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.sensors import store_discovery_sensor, store_failure_sensor
from dagster_project.defs.store_events import changed_store_events, fleet_materialization
from state_runtime.catalog import BatchMetrics, Catalog, RetentionPolicy
from state_runtime.maintenance import (
    CHECKS,
    Fleet,
    HealthSpool,
    MaintenancePolicy,
    StoreNames,
    cleanup_pass,
    run_checks,
    snapshot_pass,
    store_report_pages,
)

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
SIZES = [int(s) for s in os.environ.get("STATE_BENCH_FLEET_SIZES", "2000,20000").split(",")]
HOUR = int(os.environ.get("STATE_BENCH_FLEET_HOUR", "4"))
MINUTE = int(os.environ.get("STATE_BENCH_FLEET_MINUTE", "2000"))
DATABASE = f"state_fleet_bench_{os.getpid()}"  # its own: runs side by side do not collide
FIGURES = BatchMetrics(
    rows_in=1_000,
    keys_updated=200,
    state_rows=20_000,
    bytes_written=48_000,
    commit_ms=12.0,
    cache_hits=180,
    cache_misses=20,
    extra={"batch_ms": 900.0},
)
POLICY = MaintenancePolicy(
    snapshot_min_deltas=10,
    retention=RetentionPolicy(window=timedelta(0)),
    min_window=timedelta(0),
)
PER_STORE_CHECKS = [c.name.value for c in CHECKS if c.per_store]
FLEET_CHECKS = sum(1 for c in CHECKS if not c.per_store)


@dataclass
class Pass:
    """One pass of the cycle, or one sensor tick (no events)."""

    step: str
    wall: float
    cpu: float
    peak_mb: float
    events: int | None
    result: str


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def reset_peak() -> None:
    """Resets this process's resident high-water mark (Linux), so the next peak is one pass's."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def measured(step: str, work: Callable[[], tuple[str, int | None]]) -> Pass:
    """One pass or tick: its wall time, the CPU of this process and of every process below
    it (a pass's worker processes), and its peak memory: this process's high-water mark
    plus each worker process's own (their sum: an upper bound of the pass's peak)."""
    reset_peak()
    below = TreeSampler().start()
    started, cpu = time.perf_counter(), tree_cpu()
    result, events = work()
    wall, used = time.perf_counter() - started, tree_cpu() - cpu
    workers = sum(sum(kind["peak_rss"]) for kind in below.stop().values())
    row = Pass(step, wall, used, (peak_rss() + workers) / 2**20, events, result)
    print(f"  {step}: {row.wall:.1f} s wall, {row.cpu:.1f} s CPU ({result})", flush=True)
    return row


class Cycle:
    """The fleet's catalog, its Dagster instance and the sensors' cursors."""

    def __init__(self, url: str, folder: Path, shape: Shape, instance: DagsterInstance) -> None:
        self.url, self.shape, self.instance = url, shape, instance
        self.catalog = Catalog.open(url)
        self.roots = [query_storage(folder, q).uri for q in range(shape.queries)]
        self.fleet = Fleet(self.catalog, roots=self.roots, owner="bench-fleet")
        self.maintenance = MaintenanceResource.of(POLICY, catalog_url=url)
        self.cursors: dict[str, str | None] = {}
        self.results: dict[str, SensorResult] = {}  # each sensor's last tick
        self.versions: dict[str, tuple[int, int | None]] = {}
        self.moved = 0

    def events(self, health: HealthSpool, checks: list[str]) -> int:
        """The events a Dagster pass logs (each page's stores that changed, saved as
        reported, and the fleet's materialization), read back page by page as the code
        location does."""
        partitions = set(self.instance.get_dynamic_partitions(state_stores.name or ""))
        names = StoreNames.of(self.catalog)
        fleet_materialization(health.pages(), names)
        events = 1
        for changed in changed_store_events(
            self.instance, self.catalog, health.pages(), names, POLICY, partitions, checks
        ):
            events += len(changed.states) + len(changed.evaluations)
            changed.logged()
        versions = {
            str(r.key): (r.health.latest.version, r.health.last_snapshot_version) for r in health
        }
        # the baseline: stores whose latest version or snapshot moved since the last pass,
        # each a store event if events followed them
        self.moved = sum(1 for k, v in versions.items() if self.versions.get(k) != v)
        self.versions = versions
        return events

    def tick(self, name: str) -> str:
        """One tick of sensor ``name`` with its cursor; new partitions are added, as the daemon
        does with the tick's requests."""
        sensor = {
            "discovery": store_discovery_sensor,
            "failures": store_failure_sensor,
            "state_catalog_events": catalog_events_sensor,
        }[name]
        context = build_sensor_context(
            instance=self.instance,
            cursor=self.cursors.get(name),
            resources={"maintenance": self.maintenance},
        )
        found = sensor(context)
        assert isinstance(found, SensorResult), found
        before, self.cursors[name] = self.cursors.get(name), found.cursor
        self.results[name] = found
        for request in found.dynamic_partitions_requests or []:
            if isinstance(request, AddDynamicPartitionsRequest):
                keys = list(request.partition_keys)
                self.instance.add_dynamic_partitions(request.partitions_def_name, keys)
        if found.skip_reason is not None:
            return f"skipped: {found.skip_reason.skip_message}"
        added = sum(len(r.partition_keys) for r in found.dynamic_partitions_requests or [])
        reported = ""
        if name == "state_catalog_events":
            # the metrics ids between the positions: the fleet's one writer records in order
            batches = Cursor.parse(found.cursor).metrics.row - Cursor.parse(before).metrics.row
            reported = f", {batches:,} batches reported"
        return f"{len(found.run_requests or [])} runs, {added} partitions requested{reported}"

    def minute_of_batches(self, minute: int = 0) -> None:
        """``MINUTE`` batches' metrics, over the queries in turn, as each query's driver records
        them after its batch commits: what ``state_catalog_events`` reports at its next tick
        (``minute``: which minute, each its own batches)."""
        for n in range(MINUTE):
            query = n % self.shape.queries
            batch = 1_000_000 + (minute * MINUTE + n) // self.shape.queries
            self.catalog.record_batch_metrics(self.roots[query], query_id(query), batch, FIGURES)

    def previous_hour(self) -> None:
        """What the last hour's maintenance left: the history cleaned and validated, every
        store's state and checks reported, each sensor's cursor current (the hour's events
        are then those of a steady state, not of the fleet's first validation)."""
        self.tick("discovery")
        cleanup_pass(self.fleet, POLICY, dry_run=False)
        self.events(run_checks(self.fleet, POLICY).health, PER_STORE_CHECKS)
        self.tick("failures")
        self.tick("state_catalog_events")

    def run(self) -> list[Pass]:
        def snapshots() -> tuple[str, int | None]:
            report = snapshot_pass(self.fleet, POLICY)
            return f"{report.counts()['written']} written", 1

        def validation() -> tuple[str, int | None]:
            report = run_checks(self.fleet, POLICY)
            counts = report.validation.counts()
            events = self.events(report.health, PER_STORE_CHECKS) + FLEET_CHECKS
            result = (
                f"{'ok' if report.ok else 'PROBLEMS'}, {counts['files']:,} files read; "
                f"{self.moved:,} stores' latest version or snapshot moved"
            )
            return result, events

        def cleanup() -> tuple[str, int | None]:
            report = cleanup_pass(self.fleet, POLICY, dry_run=False)
            return f"{report.deleted_files:,} files deleted", 1

        def health() -> tuple[str, int | None]:
            health = HealthSpool.of(store_report_pages(self.fleet, POLICY))
            return f"{health.stores:,} stores", self.events(health, [])

        rows = [
            measured("snapshots due", snapshots),
            measured("validation (the hour's new files)", validation),
            measured("cleanup, executed", cleanup),
            measured("health", health),
        ]
        self.minute_of_batches()
        for name in ("discovery", "failures", "state_catalog_events"):
            rows.append(measured(f"tick: {name}", lambda n=name: (self.tick(n), None)))
        return rows


@contextmanager
def dagster_instance() -> Iterator[DagsterInstance]:
    with (
        fresh_database(SERVER, f"{DATABASE}_dagster") as url,
        instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}}) as instance,
    ):
        yield instance


def built_cycle(
    url: str, folder: Path, shape: Shape, instance: DagsterInstance
) -> tuple[Cycle, float]:
    """A fleet of ``shape`` built in the fresh catalog at ``url`` and analyzed (as autovacuum
    would have): the cycle that maintains it, and the seconds the build took."""
    Catalog.open(url, upgrade=True).close()
    print(f"{shape.stores:,} stores: building (load {load()})", flush=True)
    built = build(url, folder, shape)
    print(f"  built in {built:.0f} s (load {load()})", flush=True)
    cycle = Cycle(url, folder, shape, instance)
    with cycle.catalog.engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    return cycle, built


def bench(size: int) -> dict[str, Any]:
    shape = Shape(queries=max(1, size // 200))
    folder = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    try:
        with fresh_database(SERVER, DATABASE) as url, dagster_instance() as instance:
            cycle, built = built_cycle(url, folder, shape, instance)
            print(f"  the previous hour's maintenance (untimed; load {load()})", flush=True)
            cycle.previous_hour()
            hour = advance(url, folder, shape, HOUR)
            before = load()
            print(f"  the cycle (load {before})", flush=True)
            rows = cycle.run()
            cycle.catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cycle_wall = sum(r.wall for r in rows if r.events is not None)
    return {
        "stores": shape.stores,
        "queries": shape.queries,
        "versions": shape.versions,
        "hour_batches": HOUR,
        "build_seconds": round(built, 1),
        "hour_seconds": round(hour, 1),
        "load_before_cycle": before,
        "load_after_cycle": load(),
        "cycle_seconds": round(cycle_wall, 1),
        "events": sum(r.events or 0 for r in rows),
        "passes": [asdict(r) | {"wall": round(r.wall, 2), "cpu": round(r.cpu, 2)} for r in rows],
    }


def table(found: dict[str, Any]) -> None:
    title = (
        f"{found['stores']:,} stores, hourly cycle after {found['hour_batches']} batches "
        f"(load {found['load_before_cycle']} before, {found['load_after_cycle']} after)"
    )
    out = Table(title=title)
    for name in ("step", "wall", "CPU", "peak RSS", "Dagster events", "result"):
        out.add_column(name, justify="left" if name in {"step", "result"} else "right")
    for p in found["passes"]:
        events = "" if p["events"] is None else f"{p['events']:,}"
        out.add_row(
            p["step"],
            f"{p['wall']:.1f} s",
            f"{p['cpu']:.1f} s",
            f"{p['peak_mb']:.0f} MB",
            events,
            p["result"],
        )
    out.add_row("cycle", f"{found['cycle_seconds']:.1f} s", "", "", f"{found['events']:,}", "")
    Console(width=180).print(out)


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in results[0]["passes"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for step in steps:
        xs = [r["stores"] for r in results]
        walls = [next(p["wall"] for p in r["passes"] if p["step"] == step) for r in results]
        peaks = [next(p["peak_mb"] for p in r["passes"] if p["step"] == step) for r in results]
        axes[0].plot(xs, walls, marker="o", label=step)
        axes[1].plot(xs, peaks, marker="o", label=step)
    axes[0].set(xlabel="stores", ylabel="wall seconds", title="time per pass and tick")
    axes[1].set(xlabel="stores", ylabel="peak RSS (MB)", title="peak memory per pass and tick")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="save a plot of the passes per size here (PNG)")
    args = parser.parse_args()
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {load()}", flush=True)
    results = []
    for size in SIZES:
        results.append(bench(size))
        table(results[-1])
    if args.plot and len(results) > 1:
        plot(results, args.plot)
    print(json.dumps({"cpus": os.cpu_count(), "sizes": results}))


if __name__ == "__main__":
    main()
