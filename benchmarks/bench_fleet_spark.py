"""The snapshot and validation passes on one host in threads with one worker and with the
default workers, in the host's worker processes, and on Spark, at fleet size (issue 35).

    make bench-fleet-spark                          # 2,000 stores, Spark on local[2]
    STATE_BENCH_FLEET_SPARK_SIZE=20000              # another size
    STATE_BENCH_SPARK_MASTER=spark://host:7077      # another master (SPARK_REMOTE: Connect)
    STATE_BENCH_SPARK=0                             # no Spark way
    STATE_BENCH_FLEET_WAYS=threads,spark            # some ways (one,threads,processes,spark)

For each way of running, a fresh fleet of ``size / 200`` queries x 200 partitions
(``fleet.py``: 12 versions per store, every file verified) in a fresh PostgreSQL catalog, then
one hour of new batches (``STATE_BENCH_FLEET_HOUR``, default 4, per store), then the two
passes through their public functions: ``snapshot_pass`` (the stores due) and
``run_checks`` (validation of the hour's new files, the library's default sample). The
thread ways set ``processes=1``; the processes way one worker process per CPU (the
default on PostgreSQL for a pass this large, asked here whatever its size); the Spark
way passes ``spread=SparkSpread(...)``, its session started before the timing. Each pass's
wall time and CPU time, the CPU of this process and every process below it (the worker
processes, Spark's JVM and its Python workers included, from ``/proc``), and the ratios to
one worker and to the threads at the default workers, with the load.
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

from fleet import Shape, advance, build
from fresh_database import fresh_database
from process_tree import tree_cpu
from rich.console import Console
from rich.table import Table

from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy, run_checks, snapshot_pass
from state_runtime.maintenance.host_processes import host_cpus
from state_runtime.maintenance.spark import SparkSpread
from state_runtime.maintenance.spread import Spread
from state_runtime.runtime.spark_session import spark_session

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
SIZE = int(os.environ.get("STATE_BENCH_FLEET_SPARK_SIZE", "2000"))
HOUR = int(os.environ.get("STATE_BENCH_FLEET_HOUR", "4"))
MASTER = os.environ.get("STATE_BENCH_SPARK_MASTER", "local[2]")
SPARK = os.environ.get("STATE_BENCH_SPARK", "1") != "0"
WAYS = os.environ.get("STATE_BENCH_FLEET_WAYS", "one,threads,processes,spark").split(",")
POLICY = MaintenancePolicy(snapshot_min_deltas=10)
THREADS = replace(POLICY, processes=1)
PROCESSES = replace(POLICY, processes=host_cpus())  # the default at these sizes, asked


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(work: Callable[[], str]) -> dict[str, Any]:
    started, cpu = time.perf_counter(), tree_cpu()
    result = work()
    return {"wall": time.perf_counter() - started, "cpu": tree_cpu() - cpu, "result": result}


def way(
    name: str,
    policy: MaintenancePolicy,
    workers: int | None,
    spread: Callable[[str], Spread | None],
) -> dict[str, Any]:
    shape = Shape(queries=max(1, SIZE // 200))
    folder = Path(tempfile.mkdtemp(prefix="bench-fleet-spark-"))
    try:
        with fresh_database(SERVER, "state_fleet_spark_bench") as url:
            Catalog.open(url, upgrade=True).close()
            build(url, folder, shape)
            advance(url, folder, shape, HOUR)
            with Catalog.open(url) as catalog:
                with catalog.engine.connect() as connection:  # as autovacuum would have
                    connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                        "ANALYZE"
                    )
                fleet, on = Fleet(catalog, owner="bench"), spread(url)
                before = load()
                print(f"{name}: {shape.stores:,} stores (load {before})", flush=True)
                snapshots = timed(
                    lambda: snapshot_pass(fleet, policy, workers=workers, spread=on).summary()
                )
                validation = timed(
                    lambda: str(
                        run_checks(fleet, policy, workers=workers, spread=on).validation.counts()
                    )
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for step, row in (("snapshots", snapshots), ("validation", validation)):
        print(f"  {step}: {row['wall']:.1f} s wall, {row['cpu']:.1f} s CPU: {row['result']}")
    return {"way": name, "load": before, "snapshots": snapshots, "validation": validation}


def main() -> None:
    ran: dict[str, dict[str, Any]] = {}
    if "one" in WAYS:
        ran["one"] = way("1 worker", THREADS, 1, lambda _: None)
    if "threads" in WAYS:
        ran["threads"] = way("threads (default workers)", THREADS, None, lambda _: None)
    if "processes" in WAYS:
        name = f"{host_cpus()} host processes (default)"
        ran["processes"] = way(name, PROCESSES, None, lambda _: None)
    if SPARK and "spark" in WAYS:
        spark = spark_session(MASTER, app_name="bench-fleet-spark")  # started before the timing
        ran["spark"] = way(f"Spark {MASTER}", POLICY, None, lambda url: SparkSpread(spark, url))
    table = Table(title=f"{SIZE:,} stores, {HOUR} new batches each")
    bases = {f"÷ {ran[b]['way']}": ran[b] for b in ("one", "threads") if b in ran}
    for column in ("way", "pass", "wall s", "CPU s", *bases, "load before"):
        table.add_column(column)
    for found in ran.values():
        for step in ("snapshots", "validation"):
            row = found[step]
            table.add_row(
                found["way"],
                step,
                f"{row['wall']:.1f}",
                f"{row['cpu']:.1f}",
                *(f"{row['wall'] / base[step]['wall']:.2f}" for base in bases.values()),
                found["load"],
            )
    Console().print(table)
    print(json.dumps({"stores": SIZE, "hour_batches": HOUR, "ways": list(ran.values())}))


if __name__ == "__main__":
    main()
