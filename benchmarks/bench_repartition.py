"""Repartitioning a query's state from 4 to 16 partitions, against the baseline of reading the
same state with ``read_state`` and writing it once (Parquet), in the same run.

For each size (1M and 5M keys by default) one batch of a running aggregation commits that
many keys on 4 partitions (SQLite catalog, local files); then, each timed:

- baseline: ``read_state(...).write.parquet(...)``: read every store once, write every row once;
- dry run: route every key and count rows and bytes per new partition (no write);
- repartition: route, write 16 verified snapshots, switch the layout in one transaction.

Prints seconds and the ratio to the baseline, with the machine and its load (figures, never
asserts). ``python benchmarks/bench_repartition.py [--keys 1000000 5000000] [--to 16]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy
from state_runtime.maintenance.repartition import (
    estimate_partitions,
    execute_repartition,
    plan_repartition,
)
from state_runtime.runtime import Agg, StatefulQuery, read_state, running_aggregation
from state_runtime.runtime.spark_session import spark_session


def run(keys: int, to: int, work: Path, master: str) -> dict[str, float]:
    spark = spark_session(master, app_name="bench-repartition")
    url = f"sqlite:///{work / 'catalog.db'}"
    root = str(work / "ckpt")
    op = running_aggregation(0, ["k"], "k bigint", [Agg("n", "count")], 4)
    query = StatefulQuery("bench", root, [op], catalog_url=url)
    query.run_batch(spark.range(keys).selectExpr("id AS k"), 0).release()
    figures: dict[str, float] = {}

    started = time.perf_counter()
    read_state(spark, root, 0, catalog_url=url).write.parquet(str(work / "copy.parquet"))
    figures["baseline"] = time.perf_counter() - started
    with Catalog.open(url) as catalog:
        fleet = Fleet(catalog, owner="bench")
        plan = plan_repartition(fleet, root, "bench", to, spark_checkpoint="", idle=timedelta(0))
        started = time.perf_counter()
        estimate_partitions(spark, fleet, plan)
        figures["dry_run"] = time.perf_counter() - started
        skew = plan.skew(0, "default") or 0.0
        plan = plan_repartition(fleet, root, "bench", to, spark_checkpoint="", idle=timedelta(0))
        started = time.perf_counter()
        execute_repartition(spark, fleet, plan, MaintenancePolicy())
        figures["repartition"] = time.perf_counter() - started
    figures["skew"] = skew
    figures["bytes"] = float(sum(f.bytes for f in plan.figures))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--to", type=int, default=16, help="New partition count (from 4).")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    print(f"{'keys':>10} {'baseline s':>11} {'dry run s':>10} {'repartition s':>14} "
          f"{'x baseline':>11} {'skew':>6} {'MB written':>11}")  # fmt: skip
    for keys in args.keys:
        work = Path(tempfile.mkdtemp(prefix="bench-repartition-"))
        try:
            f = run(keys, args.to, work, args.master)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(
            f"{keys:>10,} {f['baseline']:>11.1f} {f['dry_run']:>10.1f} {f['repartition']:>14.1f} "
            f"{f['repartition'] / f['baseline']:>11.2f} {f['skew']:>6.2f} "
            f"{f['bytes'] / 1e6:>11.1f}"
        )
    print(
        f"\nmachine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, {args.master}, 4 -> {args.to} partitions, SQLite catalog, "
        f"local files; load {os.getloadavg()[0]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
