"""``make demo``: a real streaming job on embedded defaults.

A ``rate`` source generates click events; a running count and sum of amounts per user is kept
in ``state_runtime`` stores through ``foreachBatch``. Files go to ``demo-output/checkpoint``,
the catalog is the SQLite file ``demo-output/catalog.db``. Each batch prints a progress line;
the end prints a summary and what to open next.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state_runtime.catalog import Catalog, catalog_url
from state_runtime.runtime import Agg, StatefulQuery, read_state, running_aggregation
from state_runtime.runtime.session import spark_session

OUTPUT = Path("demo-output")
QUERY_ID = "clicks_per_user"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10, help="micro-batches to run")
    parser.add_argument("--rows-per-second", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    for stale in ("checkpoint", "spark-checkpoint", "catalog.db"):
        path = OUTPUT / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    OUTPUT.mkdir(exist_ok=True)
    root = str((OUTPUT / "checkpoint").absolute())
    url = catalog_url()
    print(f"checkpoint root: {root}\ncatalog:         {url}")

    spark = spark_session(
        "local[2]", app_name="state-runtime-demo", shuffle_partitions=args.partitions
    )
    op = running_aggregation(
        0,
        ["user"],
        "user string",
        [Agg("clicks", "count"), Agg("amount", "sum", "amount")],
        args.partitions,
    )
    query = StatefulQuery(QUERY_ID, root, [op], catalog_url=url)
    started = time.perf_counter()
    done: list[int] = []

    def sink(output: DataFrame, batch_id: int) -> None:
        output.count()
        done.append(batch_id)

    def process(df: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        result = query.run_batch(df, batch_id)
        try:
            sink(result.output, batch_id)
        finally:
            result.release()
        m = result.metrics
        print(
            f"batch {batch_id:>3}: {m.rows_in:>7,} events, {m.keys_updated:>6,} users updated, "
            f"{m.state_rows:>7,} users in state, {m.bytes_written / 1024:>6.1f} KiB written, "
            f"cache {m.cache_hits}/{m.cache_hits + m.cache_misses} hits, "
            f"{time.perf_counter() - t0:.2f} s",
            flush=True,
        )

    events = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", args.rows_per_second)
        .load()
        .select(
            F.concat(
                F.lit("user"), F.pmod(F.hash("value"), F.lit(args.users)).cast("string")
            ).alias("user"),
            (F.col("value") % 97).alias("amount"),
        )
    )
    stream = (
        events.writeStream.foreachBatch(process)
        .option("checkpointLocation", str(OUTPUT / "spark-checkpoint"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    while len(done) < args.batches and stream.isActive:
        time.sleep(0.2)
    stream.stop()
    if stream.exception():
        raise SystemExit(f"the streaming query failed: {stream.exception()}")

    state = read_state(spark, root, 0, catalog_url=url)
    top = state.orderBy(F.col("value.clicks").desc()).limit(3).collect()
    files = list((OUTPUT / "checkpoint").rglob("*.delta"))
    with Catalog.open(url) as catalog:
        latest = catalog.latest_committed(query.root)
    print(
        f"\ndone: {len(done)} batches in {time.perf_counter() - started:.0f} s; "
        f"{state.count():,} users in state across {len(latest)} stores, "
        f"versions {sorted({r.version for r in latest.values()})}, "
        f"{len(files)} delta files, {sum(f.stat().st_size for f in files) / 1024:.0f} KiB"
    )
    print("top users:", ", ".join(f"{r.key.user}={r.value.clicks}" for r in top))
    print(
        "\nnext:\n"
        "  make dagster                      the Dagster UI on these stores\n"
        "  sql/store_health.sql              the operators' queries (psql on PostgreSQL)\n"
        "  .venv/bin/statestore health       store health from the command line\n"
        f"  read_state(spark, '{root}', 0)    the state as a DataFrame (see README)"
    )
    spark.stop()


if __name__ == "__main__":
    main()
