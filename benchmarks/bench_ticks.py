"""Each sensor's tick at fleet size, quiet and with a minute's batches (issue 35).

    make bench-ticks                                  # 20,000 stores
    STATE_BENCH_TICK_SIZES=2000,100000 make bench-ticks
    STATE_BENCH_FLEET_MINUTE=2000                     # batches' metrics a minute

For each size, the fleet of ``bench_fleet.py`` (``fleet.py``: ``size / 200`` queries x 200
stores, PostgreSQL) and a Dagster instance on PostgreSQL, the sensors' first ticks run
untimed (the discovery sensor adds every store's partition). Then, timed as the daemon calls
them: ``ROUNDS`` quiet ticks of each sensor (nothing changed since its last), and ``ROUNDS``
ticks of ``state_catalog_events`` each after a minute of batches' metrics (``MINUTE``, over
the queries in turn), with the events that tick wrote to Dagster's event log. Each figure with
the load average; a JSON line at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from bench_fleet import DATABASE, MINUTE, SERVER, Cycle, load, measured
from dagster._core.test_utils import instance_for_test
from fleet import Shape, build
from fresh_database import fresh_database

SIZES = [int(s) for s in os.environ.get("STATE_BENCH_TICK_SIZES", "20000").split(",")]
ROUNDS = 3
SENSORS = ("discovery", "failures", "state_catalog_events")


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


def bench(size: int) -> dict[str, Any]:
    shape = Shape(queries=max(1, size // 200))
    folder = Path(tempfile.mkdtemp(prefix="bench-ticks-"))
    rows: list[dict[str, Any]] = []

    def timed(step: str, cycle: Cycle, sensor: str, events: str | None = None) -> None:
        before = batch_events(events) if events else 0
        found = measured(step, lambda: (cycle.tick(sensor), None))
        written = batch_events(events) - before if events else 0
        rows.append(
            {"step": step, "wall": round(found.wall, 2), "cpu": round(found.cpu, 2)}
            | {"events": written, "result": found.result, "load": load()}
        )
        print(f"    {written:,} batch events written, load {load()}", flush=True)

    try:
        with (
            fresh_database(SERVER, DATABASE) as url,
            fresh_database(SERVER, f"{DATABASE}_dagster") as dagster_url,
            instance_for_test(
                overrides={"storage": {"postgres": {"postgres_url": dagster_url}}}
            ) as instance,
        ):
            from state_runtime.catalog import Catalog

            Catalog.open(url, upgrade=True).close()
            print(f"{shape.stores:,} stores: building (load {load()})", flush=True)
            built = build(url, folder, shape)
            print(f"  built in {built:.0f} s (load {load()})", flush=True)
            cycle = Cycle(url, folder, shape, instance)
            with cycle.catalog.engine.connect() as connection:  # as autovacuum would have
                connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    "ANALYZE"
                )
            for sensor in SENSORS:  # the first ticks: partitions added, the first report
                print(f"  first tick of {sensor}: {cycle.tick(sensor)}", flush=True)
            for _ in range(ROUNDS):
                for sensor in SENSORS:
                    timed(f"quiet tick: {sensor}", cycle, sensor)
            for minute in range(ROUNDS):
                cycle.minute_of_batches(minute)
                timed(f"tick after {MINUTE:,} batches", cycle, SENSORS[2], dagster_url)
            cycle.catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"stores": shape.stores, "queries": shape.queries, "ticks": rows}


def main() -> None:
    print(f"{os.cpu_count()} CPUs, load {load()}", flush=True)
    print(json.dumps({"sizes": [bench(size) for size in SIZES]}))


if __name__ == "__main__":
    main()
