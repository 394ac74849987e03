"""transformWithState end to end: three ``StatefulProcessor`` workloads on this runtime
(``transform_with_state``) and on Spark's ``transformWithStateInPandas`` and
``transformWithState`` (RocksDB), each processor class the same on both engines.

Workloads: ``value`` (a running count in a value state), ``list`` (each input row appended
to a list state, the list never read back whole), ``timers`` (a running count; each key with
rows registers a processing-time timer 1 ms ahead, which fires in the next batch and emits
the count: after the first batch, where only a tenth of the keys register, timers fire on
about a tenth of the keys per batch).

The same input for every run: one file with each of ``--keys`` keys once (builds the state),
then ``--batches`` files of ``--updates`` random keys; a file-source stream reads one file per
micro-batch (``availableNow``) into a ``noop`` sink. Each engine (ours and Spark's, each in
the pandas and the Row form) runs every workload in its own process (one JVM per engine).
Per-batch latency is Spark's ``triggerExecution`` duration. Prints the first batch, median
and p90 per engine and workload and the ratios (Spark / ours, in the same form); for our
engines also the slowest state partition's task per batch (``max_task_ms`` of the catalog's
batch metrics: the rest of a batch is outside the operator). ``--quick`` is a short run.

The baseline ``ours-mgws`` runs the ``value`` workload's count on our older operator,
``map_groups_with_state``, in the same run. ``floor`` runs, on the ``value`` workload's
files, a job of the shape every engine here runs per batch (the file source, one shuffle
into ``--partitions``, a Python ``mapInArrow`` stage passing the rows through, the ``noop``
sink) with no state and no catalog: the per-batch cost no engine of this shape goes below, so
Spark's batch over the floor's bounds the ratio any runtime could reach. Spark runs
``local[2,4]``: a failed task is tried again, as on a cluster. Spark's fixed 10 s wait for
a Python worker to connect back (``PythonWorkerFactory.createSimpleWorker``, pyspark 4.3)
has no setting; the worker it starts on the driver for a processor's ``init``
(``PRE_INIT``) is no task and is not tried again: under heavy load Spark's engines may fail
there (docs/transform-with-state.md).
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

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    TimerValues,
)

ENGINES = ("floor", "ours-mgws", "ours-pandas", "spark-pandas", "ours-row", "spark-row")
BASELINE = "ours-mgws"
"""``map_groups_with_state``'s count: the ``value`` workload only."""
FLOOR = "floor"
"""The stateless job of the same shape: the ``value`` workload only."""
WORKLOADS = ("value", "list", "timers")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PARTS = ("addBatch", "queryPlanning", "walCommit", "commitOffsets", "latestOffset")
"""Spark's progress ``durationMs`` parts printed per engine: ``addBatch`` is the batch's job
(and, for ours, the ``foreachBatch`` function's driver work); the rest is Spark's streaming
bookkeeping, which every engine pays."""
OUTPUT = "k bigint, count bigint"


def _size(rows: Any) -> int:
    """The number of input rows, in either form (frames or Rows)."""
    return sum(1 if isinstance(r, tuple) else len(r) for r in rows)


class _Form(StatefulProcessor):
    """A processor in the pandas or the Row form (one output row per call)."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def emit(self, key: int, count: int) -> Iterator[Any]:
        if self.pandas:
            import pandas as pd

            yield pd.DataFrame({"k": [key], "count": [count]})
        else:
            yield Row(k=key, count=count)


class RunningCount(_Form):
    """``value``: the key's row count so far."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "count bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + _size(rows)
        self.count.update((n,))
        return self.emit(int(key[0]), n)


class Appends(_Form):
    """``list``: each input row appended to the key's list; emits the number appended."""

    def init(self, handle: Any) -> None:
        self.seen = handle.getListState("seen", "k bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        n = _size(rows)
        self.seen.appendList([(int(key[0]),)] * n)
        return self.emit(int(key[0]), n)


class Timers(_Form):
    """``timers``: a running count; a timer 1 ms ahead for each key with rows (in the first
    batch, a tenth of the keys), emitting the count when it fires."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        before = self.count.get()
        n = (before or (0,))[0] + _size(rows)
        self.count.update((n,))
        if before is not None or key[0] % 10 == 0:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        return iter(())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        return self.emit(int(key[0]), (self.count.get() or (0,))[0])


def count(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: Any) -> list[tuple[Any, ...]]:
    """``value`` on ``map_groups_with_state`` (the baseline): the key's row count so far."""
    n = (state.get() or (0,))[0] + len(rows)
    state.update((n,))
    return [(key[0], n)]


PROCESSORS: dict[str, tuple[type[_Form], str]] = {
    "value": (RunningCount, "None"),
    "list": (Appends, "None"),
    "timers": (Timers, "ProcessingTime"),
}


def _through(batches: Iterator[Any]) -> Iterator[Any]:
    """The floor's Python stage: every Arrow batch passed on as it came."""
    yield from batches


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


def run_engine(
    engine: str, workloads: list[str], work: Path, partitions: int
) -> dict[str, dict[str, list[float]]]:
    """Each workload's per-batch seconds on ``engine`` (``latencies``; for ours also
    ``tasks``, the slowest task's seconds), one session for all."""
    from pyspark.sql import DataFrame

    from state_runtime.catalog import Catalog
    from state_runtime.runtime import StatefulQuery, map_groups_with_state, transform_with_state
    from state_runtime.runtime.spark_session import spark_session

    spark = spark_session(
        "local[2,4]",
        app_name=f"bench-tws-{engine}",
        extra={
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        },
    )
    pandas = engine.endswith("pandas")
    results = {}
    for workload in workloads:
        if engine in (BASELINE, FLOOR) and workload != "value":
            continue
        cls, time_mode = PROCESSORS[workload]
        query = None
        source = (
            spark.readStream.schema("k bigint")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(work / "in" / "f*"))
        )
        if engine == BASELINE:
            op = map_groups_with_state(
                0, ["k"], "k bigint", "count bigint", OUTPUT, count, partitions
            )
        elif engine.startswith("ours"):
            op = transform_with_state(
                0, ["k"], "k bigint", cls(pandas), OUTPUT, partitions,
                time_mode=time_mode, pandas=pandas,
            )  # fmt: skip
        if engine.startswith("ours"):
            query = StatefulQuery(
                workload,
                str(work / f"state-{engine}-{workload}"),
                [op],
                catalog_url=f"sqlite:///{work / f'catalog-{engine}-{workload}.db'}",
            )

            def sink(output: DataFrame, batch_id: int) -> None:
                output.write.format("noop").mode("overwrite").save()

            writer = source.writeStream.foreachBatch(query.foreach_batch(sink))
        elif engine == FLOOR:

            def through(output: DataFrame, batch_id: int) -> None:
                shuffled = output.repartition(partitions, "k")
                shuffled = shuffled.mapInArrow(_through, shuffled.schema)
                shuffled.write.format("noop").mode("overwrite").save()

            writer = source.writeStream.foreachBatch(through)
        else:
            grouped = source.groupBy("k")
            method = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
            out = method(cls(pandas), OUTPUT, "Update", time_mode)
            writer = out.writeStream.outputMode("update").format("noop")
        stream = (
            writer.option("checkpointLocation", str(work / f"ckpt-{engine}-{workload}"))
            .trigger(availableNow=True)
            .start()
        )
        # not awaitTermination: with processing-time timers Spark runs no-data batches
        # without end (measured: 430 after the last file), so the stream stops once the
        # files are processed
        stream.processAllAvailable()
        stream.stop()
        progress = [p for p in stream.recentProgress if p.numInputRows > 0]
        results[workload] = {
            "latencies": [p.durationMs["triggerExecution"] / 1000 for p in progress]
        }
        for part in PARTS:  # where each batch's time went, as Spark's progress splits it
            results[workload][part] = [p.durationMs.get(part, 0) / 1000 for p in progress]
        if query is not None:
            with Catalog.open(query.catalog_url) as catalog:
                recorded = catalog.batch_metrics(query.root, workload, limit=10_000)
            query.catalog.close()
            ordered = sorted(recorded, key=lambda m: m.batch_id)
            results[workload]["tasks"] = [m.metrics.extra["max_task_ms"] / 1000 for m in ordered]
    spark.stop()
    return results


def _figures(latencies: list[float]) -> tuple[float, float, float]:
    """First batch, median and p90 of the update batches."""
    updates = sorted(latencies[1:]) or latencies
    return latencies[0], statistics.median(updates), updates[int(0.9 * (len(updates) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="10k keys, 1k updates, 4 batches")
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    if args.engine:  # a child: one engine, the latencies as JSON on the last line
        results = run_engine(args.engine, workloads, Path(args.work), args.partitions)
        print(json.dumps(results))
        return
    if args.quick:
        args.keys, args.updates, args.batches = 10_000, 1_000, 4
    engines = args.engines.split(",")
    runs: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(work / "in", args.keys, args.batches, args.updates)
        for engine in engines:
            child = subprocess.run(
                [sys.executable, __file__, "--engine", engine, "--work", str(work),
                 "--partitions", str(args.partitions), "--workloads", args.workloads],
                capture_output=True, text=True,
            )  # fmt: skip
            if child.returncode:
                sys.exit(f"{engine} failed:\n{child.stderr[-3000:]}")
            runs[engine] = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"{engine}: {json.dumps(runs[engine])}", flush=True)
    print(f"{args.keys} keys, {args.updates} updates per batch, {args.batches} batches")
    print(f"{'workload':<10}{'engine':<16}{'first s':>10}{'median s':>10}{'p90 s':>10}")
    for workload in workloads:
        ran = [e for e in engines if workload in runs[e]]
        figures = {e: _figures(runs[e][workload]["latencies"]) for e in ran}
        for engine, (first, median, p90) in figures.items():
            print(f"{workload:<10}{engine:<16}{first:>10.2f}{median:>10.2f}{p90:>10.2f}")
            for part in ("tasks", *PARTS):
                if part in runs[engine][workload]:
                    first, median, p90 = _figures(runs[engine][workload][part])
                    label = "  slowest task" if part == "tasks" else f"  {part}"
                    print(f"{'':<10}{label:<16}{first:>10.2f}{median:>10.2f}{p90:>10.2f}")
        for form in ("pandas", "row"):
            ours, theirs = figures.get(f"ours-{form}"), figures.get(f"spark-{form}")
            if ours and theirs:
                print(
                    f"{workload:<10}Spark / ours ({form}): first batch "
                    f"{theirs[0] / ours[0]:.1f}x, median {theirs[1] / ours[1]:.1f}x, "
                    f"p90 {theirs[2] / ours[2]:.1f}x"
                )
            floor = figures.get(FLOOR)
            if floor and theirs:  # no engine of this shape goes below the floor's batch
                print(
                    f"{workload:<10}Spark ({form}) / floor, the most any engine reaches: "
                    f"first batch {theirs[0] / floor[0]:.1f}x, median {theirs[1] / floor[1]:.1f}x"
                )


if __name__ == "__main__":
    main()
