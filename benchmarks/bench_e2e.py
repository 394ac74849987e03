"""End-to-end: a streaming count by key on this runtime and on Spark's built-in providers.

The same input for every engine: one file with each of ``--keys`` keys once (builds the
state), then ``--batches`` files of ``--updates`` random keys each; a file-source stream reads
one file per micro-batch and counts by key. Engines:

- ``state_runtime``: foreachBatch + StatefulQuery with a running count;
- ``spark-hdfs``: ``groupBy(k).count()`` with the HDFS-backed state store provider;
- ``spark-rocksdb``: the same with RocksDB and changelog checkpointing.

Per-batch latency is Spark's own ``triggerExecution`` duration; checkpoint bytes per batch is
the growth of the state folder across the update batches (our catalog is not counted). Each
engine runs in its own process. Prints a table and draws ``docs/bench-e2e.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = ["state_runtime", "spark-hdfs", "spark-rocksdb"]


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_inputs(spark: Any, folder: Path, keys: int, batches: int, updates: int) -> None:
    rng = random.Random(42)
    spark.range(keys).toDF("k").coalesce(1).write.parquet(str(folder / "f0000"))
    for b in range(1, batches + 1):
        sample = [(rng.randrange(keys),) for _ in range(updates)]
        spark.createDataFrame(sample, "k bigint").coalesce(1).write.parquet(
            str(folder / f"f{b:04d}")
        )


def run_engine(engine: str, work: Path, inputs: Path, partitions: int) -> dict[str, Any]:
    from pyspark.sql import DataFrame

    from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
    from state_runtime.runtime.session import spark_session

    conf = {"spark.sql.streaming.stateStore.maintenanceInterval": "600s"}
    if engine == "spark-rocksdb":
        conf |= {
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            ),
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        }
    spark = spark_session(
        "local[2]", app_name=f"bench-{engine}", shuffle_partitions=partitions, extra=conf
    )
    source = (
        spark.readStream.schema("k bigint")
        .option("maxFilesPerTrigger", 1)
        .option("recursiveFileLookup", "true")
        .parquet(str(inputs))
    )
    checkpoint = work / "spark-checkpoint"
    if engine == "state_runtime":
        root = work / "state"
        op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], partitions)
        query = StatefulQuery(
            "bench", str(root), [op], catalog_url=f"sqlite:///{work / 'catalog.db'}"
        )

        def sink(output: DataFrame, batch_id: int) -> None:
            output.write.format("noop").mode("overwrite").save()

        writer = source.writeStream.foreachBatch(query.foreach_batch(sink))
        state_dir = root
    else:
        writer = source.groupBy("k").count().writeStream.outputMode("update").format("noop")
        state_dir = checkpoint / "state"
    stream = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    sizes: dict[int, int] = {}
    seen = -1
    while stream.isActive:
        progress = stream.lastProgress
        if progress and progress["batchId"] != seen:
            seen = progress["batchId"]
            sizes[seen] = folder_bytes(state_dir) if state_dir.exists() else 0
        time.sleep(0.05)
    stream.awaitTermination()
    progress = [p for p in stream.recentProgress if p["numInputRows"] > 0]
    spark.stop()
    latencies = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    return {"latencies": latencies, "final_bytes": folder_bytes(state_dir), "sizes": sizes}


def child(args: argparse.Namespace) -> None:
    result = run_engine(args.engine, Path(args.work), Path(args.inputs), args.partitions)
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--plot", default="docs/bench-e2e.png")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        child(args)
        return

    from state_runtime.runtime.session import spark_session

    base = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    inputs = base / "inputs"
    spark = spark_session("local[2]", app_name="bench-inputs")
    write_inputs(spark, inputs, args.keys, args.batches, args.updates)
    spark.stop()
    results: dict[str, dict[str, Any]] = {}
    for engine in args.engines.split(","):
        work = base / engine
        work.mkdir()
        print(f"running {engine} ...", flush=True)
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--engine",
                engine,
                "--work",
                str(work),
                "--inputs",
                str(inputs),
                "--partitions",
                str(args.partitions),
            ],
            capture_output=True,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            raise SystemExit(f"{engine} failed")
        results[engine] = json.loads(line[len("RESULT ") :])
    shutil.rmtree(base, ignore_errors=True)
    report(results, args)


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nmachine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}; local[2], {args.partitions} partitions, {args.keys:,} keys, "
        f"{args.updates:,} updates/batch, {args.batches} batches"
    )
    print("\n| engine | median batch latency | p90 | checkpoint bytes per update batch | vs ours |")
    print("|---|---|---|---|---|")
    rows = {}
    for engine, r in results.items():
        update_lat = r["latencies"][1:]  # the first batch builds the state
        sizes = {int(k): v for k, v in r["sizes"].items()}
        first = sizes.get(1, sizes.get(min(sizes)) if sizes else 0)
        per_batch = (r["final_bytes"] - first) / max(1, args.batches - 1)
        rows[engine] = (
            statistics.median(update_lat),
            sorted(update_lat)[int(0.9 * (len(update_lat) - 1))],
            per_batch,
        )
    ours = rows.get("state_runtime")
    for engine, (med, p90, per_batch) in rows.items():
        ratio = (
            "" if ours is None else f"{med / ours[0]:.2f}x time, {per_batch / ours[2]:.2f}x bytes"
        )
        print(f"| {engine} | {med:.2f} s | {p90:.2f} s | {per_batch / 1024:.1f} KiB | {ratio} |")
    plot(results, args.plot)


def plot(results: dict[str, dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for engine, r in results.items():
        lat = r["latencies"][1:]
        ax1.plot(range(1, len(lat) + 1), lat, marker=".", label=engine)
        sizes = sorted((int(k), v) for k, v in r["sizes"].items())
        ax2.plot(
            [k for k, _ in sizes], [v / 1024 / 1024 for _, v in sizes], marker=".", label=engine
        )
    ax1.set(title="batch latency (update batches)", xlabel="batch", ylabel="seconds")
    ax2.set(title="state checkpoint folder size", xlabel="batch", ylabel="MiB")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
