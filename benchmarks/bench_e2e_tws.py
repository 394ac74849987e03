"""transformWithState end to end: one running-count ``StatefulProcessor`` on this runtime
(``transform_with_state``) and on Spark's ``transformWithStateInPandas`` (RocksDB).

The same input for both: one file with each of ``--keys`` keys once (builds the state), then
``--batches`` files of ``--updates`` random keys; a file-source stream reads one file per
micro-batch (``availableNow``) into a ``noop`` sink. Each engine runs in its own process.
Per-batch latency is Spark's ``triggerExecution`` duration. Prints the first batch, median
and p90 per engine and the ratios (Spark / ours). ``--quick`` is a short run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

ENGINES = ("state_runtime", "transformWithStateInPandas")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class RunningCount(StatefulProcessor):
    """The same class on both engines."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "count bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        n = (self.count.get() or (0,))[0] + sum(len(r) for r in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "count": [n]})


def write_inputs(folder: Path, keys: int, batches: int, updates: int) -> None:
    from state_runtime.runtime.spark_session import spark_session

    spark = spark_session("local[2]", app_name="bench-tws-inputs")
    rng = random.Random(42)
    spark.range(keys).toDF("k").coalesce(1).write.parquet(str(folder / "f0000"))
    for b in range(1, batches + 1):
        sample = [(rng.randrange(keys),) for _ in range(updates)]
        spark.createDataFrame(sample, "k bigint").coalesce(1).write.parquet(
            str(folder / f"f{b:04d}")
        )
    spark.stop()


def run_engine(engine: str, work: Path, partitions: int) -> list[float]:
    from pyspark.sql import DataFrame

    from state_runtime.runtime import StatefulQuery, transform_with_state
    from state_runtime.runtime.spark_session import spark_session

    spark = spark_session(
        "local[2]",
        app_name=f"bench-tws-{engine}",
        extra={
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        },
    )
    source = (
        spark.readStream.schema("k bigint")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in" / "f*"))
    )
    if engine == "state_runtime":
        op = transform_with_state(
            0, ["k"], "k bigint", RunningCount(), "k bigint, count bigint", partitions
        )
        query = StatefulQuery(
            "bench", str(work / "state"), [op], catalog_url=f"sqlite:///{work / 'catalog.db'}"
        )

        def sink(output: DataFrame, batch_id: int) -> None:
            output.write.format("noop").mode("overwrite").save()

        writer = source.writeStream.foreachBatch(query.foreach_batch(sink))
    else:
        counted = source.groupBy("k").transformWithStateInPandas(
            RunningCount(), "k bigint, count bigint", "Update", "None"
        )
        writer = counted.writeStream.outputMode("update").format("noop")
    stream = (
        writer.option("checkpointLocation", str(work / f"ckpt-{engine}"))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    progress = [p for p in stream.recentProgress if p.numInputRows > 0]
    spark.stop()
    return [p.durationMs["triggerExecution"] / 1000 for p in progress]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="10k keys, 1k updates, 4 batches")
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:  # a child: one engine, the latencies as JSON on the last line
        print(json.dumps(run_engine(args.engine, Path(args.work), args.partitions)))
        return
    if args.quick:
        args.keys, args.updates, args.batches = 10_000, 1_000, 4
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(work / "in", args.keys, args.batches, args.updates)
        results: dict[str, list[float]] = {}
        for engine in ENGINES:
            out = subprocess.run(
                [sys.executable, __file__, "--engine", engine, "--work", str(work),
                 "--partitions", str(args.partitions)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            results[engine] = json.loads(out.strip().splitlines()[-1])
    print(f"{args.keys} keys, {args.updates} updates per batch, {args.batches} batches")
    print(f"{'engine':<28}{'first s':>10}{'median s':>10}{'p90 s':>10}")
    figures = {}
    for engine, latencies in results.items():
        updates = sorted(latencies[1:]) or latencies
        figures[engine] = (
            latencies[0],
            statistics.median(updates),
            updates[int(0.9 * (len(updates) - 1))],
        )
        first, median, p90 = figures[engine]
        print(f"{engine:<28}{first:>10.2f}{median:>10.2f}{p90:>10.2f}")
    ours, theirs = figures["state_runtime"], figures["transformWithStateInPandas"]
    print(
        f"Spark / ours: first batch {theirs[0] / ours[0]:.1f}x, median {theirs[1] / ours[1]:.1f}x"
    )


if __name__ == "__main__":
    main()
