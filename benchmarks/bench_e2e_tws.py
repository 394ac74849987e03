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
micro-batch (``availableNow``) into a ``noop`` sink; each stream is stopped once its data
batches have read every input row (Spark runs no-data batches without end while
processing-time timers are pending), and only data batches count, for every engine. Each
engine (ours and Spark's, each in the pandas and the Row form) runs the workloads one after
another in its own process (one JVM per engine): only the first workload's first batch
starts the Python workers. Per-batch latency is Spark's ``triggerExecution`` duration, with
the 1-minute load when the batch was seen. Prints the first batch, median and p90 per engine
and workload and the ratios (Spark / ours, in the same form); for our
engines also the slowest state partition's task per batch (``max_task_ms`` of the catalog's
batch metrics: the rest of a batch is outside the operator) and the catalog's commit.
``--quick`` is a short run.

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
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.query import StreamingQuery
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
POLL_S = 1
"""How often a run looks for its stream's new progress."""


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


def run_engine(engine: str, workloads: list[str], work: Path, partitions: int, rows: int) -> None:
    """Print each workload's per-data-batch seconds on ``engine`` (``latencies``; for ours
    also ``tasks``, the slowest task's seconds) and 1-minute loads as a JSON line, one
    session for all; each stream stopped once its data batches hold the input's ``rows``."""
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
        progress, loads = data_batches(stream, rows)
        results[workload] = {
            "latencies": [p.durationMs["triggerExecution"] / 1000 for p in progress],
            "loads": loads,
        }
        for part in PARTS:  # where each batch's time went, as Spark's progress splits it
            results[workload][part] = [p.durationMs.get(part, 0) / 1000 for p in progress]
        if query is not None:
            with Catalog.open(query.catalog_url) as catalog:
                recorded = catalog.batch_metrics(query.root, workload, limit=10_000)
            query.catalog.close()
            by_batch = {m.batch_id: m.metrics for m in recorded}
            results[workload]["tasks"] = [
                by_batch[p.batchId].extra["max_task_ms"] / 1000 for p in progress
            ]
            results[workload]["catalog commit"] = [
                by_batch[p.batchId].commit_ms / 1000 for p in progress
            ]
        print(json.dumps({"workload": workload, **results[workload]}), flush=True)
    spark.stop()


def data_batches(stream: StreamingQuery, rows: int) -> tuple[list[Any], list[float]]:
    """Wait until ``stream``'s committed data batches hold all ``rows`` input rows, then stop
    it: the progress of its data batches (``numInputRows`` > 0) in order, and the 1-minute
    load when each was seen. Not ``awaitTermination`` nor ``processAllAvailable``: with
    pending processing-time timers Spark runs no-data batches without end, even under
    ``availableNow`` (measured: 2,174 in 26 min after the last file). A progress event is
    posted after its batch's commit log entry, so a data batch seen here has committed."""
    seen: dict[int, Any] = {}
    loads: dict[int, float] = {}
    while True:
        ended = stream.awaitTermination(POLL_S)  # raises if the stream failed
        for p in stream.recentProgress:
            if p.numInputRows > 0 and p.batchId not in seen:
                seen[p.batchId] = p
                loads[p.batchId] = os.getloadavg()[0]
        if ended or sum(p.numInputRows for p in seen.values()) >= rows:
            break
    stream.stop()
    read = sum(p.numInputRows for p in seen.values())
    if read != rows:
        raise RuntimeError(f"stream {stream.name or stream.id} read {read} rows of {rows}")
    return [seen[b] for b in sorted(seen)], [loads[b] for b in sorted(seen)]


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
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    if args.engine:  # a child: one engine, each workload's figures as a JSON line
        run_engine(args.engine, workloads, Path(args.work), args.partitions, args.rows)
        return
    if args.quick:
        args.keys, args.updates, args.batches = 10_000, 1_000, 4
    engines = args.engines.split(",")
    runs: dict[str, dict[str, dict[str, list[float]]]] = {e: {} for e in engines}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(work / "in", args.keys, args.batches, args.updates)
        for engine in engines:  # a failed engine is reported; the others still run
            log = work / f"{engine}.log"
            with log.open("w") as errors:
                child = subprocess.Popen(
                    [sys.executable, __file__, "--engine", engine, "--work", str(work),
                     "--partitions", str(args.partitions), "--workloads", args.workloads,
                     "--rows", str(args.keys + args.batches * args.updates)],
                    stdout=subprocess.PIPE, stderr=errors, text=True,
                )  # fmt: skip
                assert child.stdout is not None
                for line in child.stdout:  # printed as each workload ends: a cut run keeps them
                    figures = json.loads(line)
                    runs[engine][figures.pop("workload")] = figures
                    print(f"{engine}: {line.strip()}", flush=True)
            if child.wait():
                print(f"{engine} failed:\n{log.read_text()[-3000:]}", flush=True)
    print(f"{args.keys} keys, {args.updates} updates per batch, {args.batches} batches")
    print(f"{'workload':<10}{'engine':<16}{'first s':>10}{'median s':>10}{'p90 s':>10}")
    floor = _figures(runs[FLOOR]["value"]["latencies"]) if "value" in runs.get(FLOOR, {}) else None
    for workload in workloads:
        ran = [e for e in engines if workload in runs[e]]
        figures = {e: _figures(runs[e][workload]["latencies"]) for e in ran}
        for engine, (first, median, p90) in figures.items():
            loads = runs[engine][workload]["loads"]
            print(
                f"{workload:<10}{engine:<16}{first:>10.2f}{median:>10.2f}{p90:>10.2f}"
                f"  load {min(loads):.0f} to {max(loads):.0f}"
            )
            for part in ("tasks", "catalog commit", *PARTS):
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
            if floor and theirs:  # no engine of this shape goes below the floor's batch
                # first batches compare only in each session's first workload: later ones
                # start with the Python workers and the JVM warm
                first = (
                    f"first batch {theirs[0] / floor[0]:.1f}x, " if workload == workloads[0] else ""
                )
                print(
                    f"{workload:<10}Spark ({form}) / floor, the most any engine reaches: "
                    f"{first}median {theirs[1] / floor[1]:.1f}x"
                )


if __name__ == "__main__":
    main()
