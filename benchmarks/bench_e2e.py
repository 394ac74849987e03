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

``--partitions`` takes a list (``4,200,1000``): every engine runs at each count. ``--catalogs``
(``sqlite``, ``postgresql``; PostgreSQL at ``--pg``, a fresh database per run) runs our engines
once per catalog. For our engines the run also counts the catalog's work for real: the
transactions begun on the driver's engine in each batch (SQLAlchemy ``begin`` events; median
over the update batches), and on PostgreSQL every transaction committed in the run's database
by any process (``pg_stat_database.xact_commit``, per batch over the whole run, the first
batch and the setup included) and the peak number of connections to it (``pg_stat_activity``
sampled every 50 ms from another database). ``--baseline-tree PATH`` adds the engine
``state_runtime@baseline``: the same child with ``state_runtime`` imported from another
checkout (driver and Python workers), e.g. the main branch before a change.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from e2e_report import BASELINE, CONNECT, PANDAS, plot, processes_report, report, summary
from process_tree import TreeSampler

ENGINES = ["state_runtime", BASELINE, PANDAS, "transformWithStateInPandas"]
OURS = ("state_runtime", CONNECT)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


WORKER_ALLOCATOR = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "262144"}
"""Allocator settings for Python workers holding state on disk (docs/state-on-disk.md)."""


def ours(engine: str) -> bool:
    """Our engines: ``state_runtime``, its Connect variant, the baseline tree's."""
    return engine.split("@")[0] in OURS


def sink_noop(output: Any, batch_id: int) -> None:
    output.write.format("noop").mode("overwrite").save()


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_inputs(
    spark: Any,
    folder: Path,
    keys: int,
    batches: int,
    updates: int,
    seed: int = 42,
    sample_of: int = 0,
) -> None:
    """A file of ``keys`` keys (none if 0), then ``batches`` files of ``updates`` keys drawn
    at random (seeded) from ``sample_of`` keys (default ``keys``)."""
    from pyspark.sql import functions as F

    if keys:
        spark.range(keys).toDF("k").coalesce(1).write.parquet(str(folder / "f0000"))
    for b in range(1, batches + 1):
        drawn = F.floor(F.rand(seed + b) * (sample_of or keys)).cast("long").alias("k")
        spark.range(updates).select(drawn).coalesce(1).write.parquet(str(folder / f"f{b:04d}"))


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


class CatalogProbe:
    """The catalog a run of our engine uses, and what it costs: the driver engine's
    transactions per batch, and on PostgreSQL the database's transaction counter and its peak
    connections (sampled from the ``postgres`` database, so the probe counts nothing itself)."""

    def __init__(self, kind: str, work: Path, pg: str) -> None:
        self.kind = kind
        self.pg = pg
        self.database = f"bench_e2e_{os.getpid()}_{int(time.time())}"
        self.url = (
            f"sqlite:///{work / 'catalog.db'}"
            if kind == "sqlite"
            else f"postgresql+psycopg2://{pg}/{self.database}"
        )
        self.per_batch: list[int] = []
        self.connects = 0
        self.peak = 0
        self._xact_start = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def _admin(self) -> Any:
        import psycopg2

        connection = psycopg2.connect(f"postgresql://{self.pg}/postgres")
        connection.autocommit = True  # no transaction block: CREATE and DROP DATABASE
        return connection

    def _sql(self, statement: str) -> None:
        admin = self._admin()
        try:
            with admin.cursor() as cursor:
                cursor.execute(statement)
        finally:
            admin.close()

    def _xact(self) -> int:
        admin = self._admin()
        with admin.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (self.database,)
            )
            found = int(cursor.fetchone()[0])
        admin.close()
        return found

    def start(self) -> None:
        from state_runtime.catalog import Catalog

        if self.kind == "postgresql":
            self._sql(f'CREATE DATABASE "{self.database}"')
        Catalog.open(self.url, upgrade=True).close()
        if self.kind == "postgresql":
            time.sleep(1.5)  # the migration's backend has flushed its statistics
            self._xact_start = self._xact()
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        admin = self._admin()
        with admin.cursor() as cursor:
            while not self._stop.is_set():
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.database,)
                )
                self.peak = max(self.peak, int(cursor.fetchone()[0]))
                time.sleep(0.05)
        admin.close()

    def watch(self, engine: Any) -> None:
        """Count the transactions and connections of the driver's engine."""
        import sqlalchemy as sa

        def begun(connection: Any) -> None:
            self._begun += 1

        def connected(*args: Any) -> None:
            self.connects += 1

        self._begun = 0
        sa.event.listen(engine, "begin", begun)
        sa.event.listen(engine, "connect", connected)

    def batch(self, run: Any) -> None:
        before = self._begun
        run()
        self.per_batch.append(self._begun - before)

    def finish(self, batches: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "catalog": self.kind,
            "txns_per_batch": self.per_batch,
            "driver_connects": self.connects,
        }
        if self.kind == "postgresql":
            self._stop.set()
            if self._sampler is not None:
                self._sampler.join()
            time.sleep(1.5)  # every backend of the run has exited and flushed its statistics
            out["pg_xact_per_batch"] = (self._xact() - self._xact_start) / max(1, batches)
            out["pg_peak_connections"] = self.peak
            self._sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        return out


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


def run_engine(
    engine: str, work: Path, inputs: Path, partitions: int, catalog: str = "sqlite", pg: str = ""
) -> dict[str, Any]:
    from pyspark.sql import DataFrame

    from state_runtime.catalog import Catalog
    from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
    from state_runtime.runtime.spark_session import spark_session

    sampler = TreeSampler().start()
    conf = {"spark.sql.streaming.stateStore.maintenanceInterval": "600s"}
    if ours(engine) and "STATE_CACHE_BYTES" in os.environ:
        # The Python workers' allocator alone (docs/state-on-disk.md): set for the whole
        # process tree, the JVM and the driver paid for it too (0.5 s a batch at 1M keys).
        conf |= {f"spark.executorEnv.{k}": v for k, v in WORKER_ALLOCATOR.items()}
    if engine != "spark-hdfs" and not ours(engine):
        conf |= {
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        }
    spark = spark_session(
        "local[2]",
        app_name=f"bench-{engine}",
        shuffle_partitions=partitions,
        extra=conf,
        remote="local" if engine.split("@")[0] == CONNECT else None,
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
    probe = CatalogProbe(catalog, work, pg) if ours(engine) else None
    if probe is not None:
        probe.start()
        root = work / "state"
        op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], partitions)
        query = StatefulQuery("bench", str(root), [op], catalog_url=probe.url)
        process = query.foreach_batch(sink_noop)
        if engine.split("@")[0] == CONNECT:
            # The function travels to the Connect server's Python worker (pickled): it holds
            # the query alone, not the probe (a thread, an Event); the driver's engine lives
            # there, so its transactions are not counted here (PostgreSQL's counters are).
            writer = source.writeStream.foreachBatch(process)
        else:
            probe.watch(query.catalog.engine)

            def counted(df: DataFrame, batch_id: int) -> None:
                assert probe is not None
                probe.batch(lambda: process(df, batch_id))

            writer = source.writeStream.foreachBatch(counted)
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
    processes = sampler.stop()
    spark.stop()
    latencies = [p.durationMs["triggerExecution"] / 1000 for p in progress]
    result = {
        "latencies": latencies,
        "final_bytes": folder_bytes(state_dir),
        "sizes": sizes,
        "processes": processes,
    }
    if query is not None and probe is not None:
        with Catalog.open(query.catalog_url) as catalog:
            recorded = catalog.batch_metrics(query.root, "bench", limit=10_000)
        query.catalog.close()
        result |= probe.finish(len(latencies))
        result["warm"] = [
            {
                "batch": m.batch_id,
                "hit_rate": m.metrics.extra["cache_hit_rate"],
                "max_load_ms": m.metrics.extra["max_load_ms"],
                "sources": m.metrics.extra["load_sources"],
                "resident_bytes": m.metrics.resident_bytes,
                "local_disk_bytes": m.metrics.local_disk_bytes,
                "compaction_bytes": m.metrics.compaction_bytes,
                "block_cache_hits": m.metrics.block_cache_hits,
                "block_cache_misses": m.metrics.block_cache_misses,
            }
            for m in sorted(recorded, key=lambda m: m.batch_id)
        ]
    return result


def child(args: argparse.Namespace) -> None:
    def run() -> dict[str, Any]:
        return run_engine(
            args.engine,
            Path(args.work),
            Path(args.inputs),
            int(args.partitions),
            args.catalogs,
            args.pg,
        )

    result = run()
    if args.restart_input:  # one more file, read by a new session on the same checkpoint
        added = Path(args.inputs) / "restart"
        shutil.copytree(args.restart_input, added)
        try:
            again = run()
        finally:
            shutil.rmtree(added)
        result["restart"] = again["latencies"]
        result["restart_processes"] = again["processes"]
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--partitions", default="4", help="one count or a list: 4,200,1000")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--catalogs", default="sqlite", help="sqlite, postgresql or both")
    parser.add_argument("--pg", default="postgres@127.0.0.1:5432", help="user@host:port")
    parser.add_argument("--baseline-tree", help="add state_runtime@baseline from this checkout")
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
    parser.add_argument(
        "--cache-fraction",
        type=int,
        help="STATE_CACHE_BYTES at 1/N of the state (16 bytes a key), with the allocator "
        "settings for state on disk (docs/state-on-disk.md), for our engines",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="after the batches, stop Spark and run one more batch on the same checkpoint",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--restart-input", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.keys, args.updates, args.batches = 50_000, 2_000, 6
    if args.engine:
        child(args)
        return

    from state_runtime.runtime.spark_session import spark_session

    base = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    inputs = base / "inputs"
    spark = spark_session("local[2]", app_name="bench-inputs")
    write_inputs(spark, inputs, args.keys, args.batches, args.updates)
    restart_input = base / "restart-input"
    if args.restart:
        write_inputs(spark, restart_input, 0, 1, args.updates, seed=7, sample_of=args.keys)
    spark.stop()
    engines = args.engines.split(",")
    if args.baseline_tree and "state_runtime@baseline" not in engines:
        engines.append("state_runtime@baseline")
    trees = {"state_runtime@baseline": args.baseline_tree}
    counts = [int(n) for n in str(args.partitions).split(",")]
    budget_env: dict[str, str] = {}
    if args.cache_fraction:
        budget_env = {"STATE_CACHE_BYTES": str(args.keys * 16 // args.cache_fraction)}
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for partitions, round_, engine in itertools.product(counts, range(args.rounds), engines):
        for catalog in args.catalogs.split(",") if ours(engine) else [""]:
            label = f"{engine}[{catalog}]" if catalog else engine
            work = base / f"{partitions}-{label}-{round_}".replace("@", "-")
            work.mkdir()
            print(
                f"running {label} at {partitions} partitions (round {round_ + 1} of "
                f"{args.rounds}) ... (load: {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            tree = trees.get(engine) or str(Path(__file__).resolve().parents[1])
            proc = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--engine",
                    engine,
                    "--work",
                    str(work),
                    "--inputs",
                    str(inputs),
                    "--partitions",
                    str(partitions),
                    "--catalogs",
                    catalog or "sqlite",
                    "--pg",
                    args.pg,
                    *(["--restart-input", str(restart_input)] if args.restart else []),
                ],
                capture_output=True,
                text=True,
                cwd=tree,  # local Python workers put their working folder first on sys.path
                env=os.environ
                | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": tree}
                | (budget_env if ours(engine) else {}),
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"{label} failed")
            result = json.loads(line[len("RESULT ") :])
            results.setdefault(partitions, {}).setdefault(label, []).append(result)
            latencies = result["latencies"]
            print(
                f"  {label} round {round_ + 1}: first batch {latencies[0]:.2f} s, median "
                f"{statistics.median(latencies[1:] or latencies):.2f} s over "
                f"{len(latencies) - 1} update batches (load: {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    for partitions, found in results.items():
        report(found, args, partitions)
        processes_report(found, args.keys * 16, budget_env.get("STATE_CACHE_BYTES"))
    if len(results) > 1:
        summary(results, args)
    plot(results[counts[0]], args.plot)


if __name__ == "__main__":
    main()
