"""End-to-end: a streaming count by key on this runtime and on Spark's own stateful engines.

The same input for every engine: one file with each of ``--keys`` keys once (builds the
state), then ``--batches`` files of ``--updates`` random keys each; a file-source stream reads
one file per micro-batch and keeps a running count per key. Engines, all with a ``noop`` sink:

- ``state_runtime``: foreachBatch + StatefulQuery with a running count;
- ``state_runtime-connect`` (not run by default): the same on a Spark Connect session (a local
  Connect server in the engine's process, ``spark_session(remote="local")``): the driver logic
  runs in the server's foreachBatch worker; compared with ``state_runtime``'s median and p90;
- ``spark-rocksdb``: ``groupBy(k).count()`` with RocksDB and changelog checkpointing (the
  baseline: Spark's fastest built-in choice);
- ``applyInPandasWithState`` and ``transformWithStateInPandas``: Spark's Python stateful APIs
  keeping the same count per key (RocksDB provider): what a PySpark user would otherwise write;
- ``spark-hdfs`` (not run by default): ``groupBy(k).count()`` with the HDFS-backed provider.

Per-batch latency is Spark's own ``triggerExecution`` duration; checkpoint bytes per batch is
the growth of the state folder across the update batches (our catalog is not counted). Each
engine runs in its own process, one after the other. Prints first batch, median, p90 and bytes
per batch for every engine with ratios against RocksDB (and against applyInPandasWithState),
the targets of issue 12, and for ``state_runtime`` the warm-copy figures (cache hit rate and
the slowest load per batch). Draws ``docs/bench-e2e.png``. ``--quick`` is a short run.
"""

from __future__ import annotations

import argparse
import itertools
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BASELINE = "spark-rocksdb"
PANDAS = "applyInPandasWithState"
ENGINES = ["state_runtime", BASELINE, PANDAS, "transformWithStateInPandas"]
CONNECT = "state_runtime-connect"
OURS = ("state_runtime", CONNECT)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


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


def count_in_pandas(key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState: the running count of one key."""
    import pandas as pd

    n = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "count": [n]})


def running_count_processor() -> Any:
    """transformWithStateInPandas: a StatefulProcessor keeping the running count of a key."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class RunningCount(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "count bigint")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(r) for r in rows)
            self.count.update((n,))
            yield pd.DataFrame({"k": [key[0]], "count": [n]})

        def close(self) -> None:
            pass

    return RunningCount()


def start(writer: Any, attempts: int = 5) -> Any:
    """Start the stream; on Connect, again when the server's foreachBatch worker missed
    Spark's fixed 10 s window to connect back (it does on a loaded machine: nothing ran)."""
    for attempt in range(1, attempts):
        try:
            return writer.start()
        except Exception as e:
            if "connect back" not in str(e):
                raise
            print(f"foreachBatch worker did not connect back (attempt {attempt})", flush=True)
    return writer.start()


def run_engine(engine: str, work: Path, inputs: Path, partitions: int) -> dict[str, Any]:
    from pyspark.sql import DataFrame

    from state_runtime.catalog import Catalog
    from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
    from state_runtime.runtime.session import spark_session

    conf = {"spark.sql.streaming.stateStore.maintenanceInterval": "600s"}
    if engine != "spark-hdfs" and engine not in OURS:
        conf |= {
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        }
    spark = spark_session(
        "local[2]",
        app_name=f"bench-{engine}",
        shuffle_partitions=partitions,
        extra=conf,
        remote="local" if engine == CONNECT else None,
    )
    source = (
        spark.readStream.schema("k bigint")
        .option("maxFilesPerTrigger", 1)
        .option("recursiveFileLookup", "true")
        .parquet(str(inputs))
    )
    checkpoint = work / "spark-checkpoint"
    state_dir = checkpoint / "state"
    query = None
    if engine in OURS:
        root = work / "state"
        op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], partitions)
        url = f"sqlite:///{work / 'catalog.db'}"
        query = StatefulQuery("bench", str(root), [op], catalog_url=url)

        def sink(output: DataFrame, batch_id: int) -> None:
            output.write.format("noop").mode("overwrite").save()

        writer = source.writeStream.foreachBatch(query.foreach_batch(sink))
        state_dir = root
    elif engine == PANDAS:
        counted = source.groupBy("k").applyInPandasWithState(
            count_in_pandas, "k bigint, count bigint", "count bigint", "update", "NoTimeout"
        )
        writer = counted.writeStream.outputMode("update").format("noop")
    elif engine == "transformWithStateInPandas":
        counted = source.groupBy("k").transformWithStateInPandas(
            running_count_processor(), "k bigint, count bigint", "Update", "None"
        )
        writer = counted.writeStream.outputMode("update").format("noop")
    else:
        writer = source.groupBy("k").count().writeStream.outputMode("update").format("noop")
    stream = start(writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    sizes: dict[int, int] = {}
    seen = -1
    while stream.isActive:
        progress = stream.lastProgress
        if progress and progress.batchId != seen:
            seen = progress.batchId
            sizes[seen] = folder_bytes(state_dir) if state_dir.exists() else 0
        time.sleep(0.05)
    stream.awaitTermination()
    # attributes, not keys: a Connect client's progress objects only have the attributes
    progress = [p for p in stream.recentProgress if p.numInputRows > 0]
    spark.stop()
    latencies = [p.durationMs["triggerExecution"] / 1000 for p in progress]
    result = {"latencies": latencies, "final_bytes": folder_bytes(state_dir), "sizes": sizes}
    if query is not None:
        with Catalog.open(query.catalog_url) as catalog:
            recorded = catalog.batch_metrics(query.root, "bench", limit=10_000)
        result["warm"] = [
            {
                "batch": m.batch_id,
                "hit_rate": m.metrics.extra["cache_hit_rate"],
                "max_load_ms": m.metrics.extra["max_load_ms"],
                "sources": m.metrics.extra["load_sources"],
            }
            for m in sorted(recorded, key=lambda m: m.batch_id)
        ]
    return result


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
    parser.add_argument(
        "--quick", action="store_true", help="a short run: 50k keys, 2k updates, 6 batches"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the engines this many times, alternating (A B A B ...), and pool the batches",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.keys, args.updates, args.batches = 50_000, 2_000, 6
    if args.engine:
        child(args)
        return

    from state_runtime.runtime.session import spark_session

    base = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    inputs = base / "inputs"
    spark = spark_session("local[2]", app_name="bench-inputs")
    write_inputs(spark, inputs, args.keys, args.batches, args.updates)
    spark.stop()
    results: dict[str, list[dict[str, Any]]] = {}
    for round_, engine in itertools.product(range(args.rounds), args.engines.split(",")):
        work = base / f"{engine}-{round_}"
        work.mkdir()
        print(
            f"running {engine} (round {round_ + 1} of {args.rounds}) ... "
            f"(load: {os.getloadavg()[0]:.2f})",
            flush=True,
        )
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
        results.setdefault(engine, []).append(json.loads(line[len("RESULT ") :]))
    shutil.rmtree(base, ignore_errors=True)
    report(results, args)


def figures(rounds: list[dict[str, Any]], batches: int) -> dict[str, float]:
    """First batch (builds the state), median and p90 of the update batches, bytes per batch;
    with several rounds, the update batches of all rounds pooled and the medians of the rest."""
    updates = [x for r in rounds for x in r["latencies"][1:]]

    def grown(r: dict[str, Any]) -> float:
        sizes = {int(k): v for k, v in r["sizes"].items()}
        first = sizes.get(1, sizes.get(min(sizes)) if sizes else 0)
        return float(r["final_bytes"] - first) / max(1, batches - 1)

    return {
        "first": statistics.median(r["latencies"][0] for r in rounds),
        "median": statistics.median(updates),
        "p90": sorted(updates)[int(0.9 * (len(updates) - 1))],
        "bytes": statistics.median(grown(r) for r in rounds),
    }


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    print(
        f"\nmachine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.2f} at the end; local[2], "
        f"{args.partitions} partitions, {args.keys:,} keys, {args.updates:,} updates/batch, "
        f"{args.batches} batches, {args.rounds} round(s)"
    )
    rows = {engine: figures(r, args.batches) for engine, r in results.items()}
    base = rows.get(BASELINE)
    print(
        "\n| engine | first batch | median | p90 | bytes per batch "
        f"| vs {BASELINE} (median, p90, bytes) |"
    )
    print("|---|---|---|---|---|---|")
    for engine, f in rows.items():
        ratio = (
            ""
            if base is None
            else (
                f"{f['median'] / base['median']:.2f}x, {f['p90'] / base['p90']:.2f}x, "
                f"{f['bytes'] / base['bytes']:.2f}x"
            )
        )
        print(
            f"| {engine} | {f['first']:.2f} s | {f['median']:.2f} s | {f['p90']:.2f} s "
            f"| {f['bytes'] / 1024:.1f} KiB | {ratio} |"
        )
    ours = rows.get("state_runtime")
    connect = rows.get(CONNECT)
    if ours is not None and connect is not None:
        median, p90 = connect["median"] / ours["median"], connect["p90"] / ours["p90"]
        print(
            f"\n{CONNECT} vs state_runtime (classic) in this run: median {median:.2f}x, "
            f"p90 {p90:.2f}x; target median <= 1.2x -> {'met' if median <= 1.2 else 'NOT met'}"
        )
    if ours is not None:
        print("\ntargets (issue 12), state_runtime in this run:")
        if base is not None:
            for what, value, goal in (
                ("median <= 0.8x RocksDB's (stretch 0.5x)", ours["median"] / base["median"], 0.8),
                ("p90 <= RocksDB's p90", ours["p90"] / base["p90"], 1.0),
                ("bytes <= 1/3 of RocksDB's", ours["bytes"] / base["bytes"], 1 / 3),
            ):
                print(f"  {what}: {value:.2f}x -> {'met' if value <= goal else 'NOT met'}")
        print(
            f"  bytes per batch <= 25 KB: {ours['bytes'] / 1000:.1f} KB -> "
            f"{'met' if ours['bytes'] <= 25_000 else 'NOT met'}"
        )
        if PANDAS in rows:
            speedup = rows[PANDAS]["median"] / ours["median"]
            print(
                f"  >= 10x faster than {PANDAS} (median): {speedup:.1f}x -> "
                f"{'met' if speedup >= 10 else 'NOT met'}"
            )
        warm = results["state_runtime"][0].get("warm", [])[1:]  # the first round's
        if warm:
            hits = statistics.mean(w["hit_rate"] for w in warm)
            loads = [w["max_load_ms"] for w in warm]
            half = len(loads) // 2
            print(
                f"\nstate_runtime warm copies (update batches of round 1): "
                f"cache hit rate {hits:.0%}; "
                f"slowest load per batch: median {statistics.median(loads):.0f} ms, first half "
                f"{statistics.median(loads[:half] or loads):.0f} ms, second half "
                f"{statistics.median(loads[half:]):.0f} ms, max {max(loads):.0f} ms"
            )
    plot(results, args.plot)


def plot(results: dict[str, list[dict[str, Any]]], path: str) -> None:
    """Batch latency and state folder growth per engine (its first round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for engine, rounds in results.items():
        r = rounds[0]
        lat = r["latencies"][1:]
        ax1.plot(range(1, len(lat) + 1), lat, marker=".", label=engine)
        sizes = sorted((int(k), v) for k, v in r["sizes"].items())
        ax2.plot(
            [k for k, _ in sizes], [v / 1024 / 1024 for _, v in sizes], marker=".", label=engine
        )
    ax1.set(title="batch latency (update batches)", xlabel="batch", ylabel="seconds")
    ax1.set_yscale("log")
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
