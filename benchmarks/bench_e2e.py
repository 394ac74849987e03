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
import platform
import random
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

BASELINE = "spark-rocksdb"
PANDAS = "applyInPandasWithState"
ENGINES = ["state_runtime", BASELINE, PANDAS, "transformWithStateInPandas"]
CONNECT = "state_runtime-connect"
OURS = ("state_runtime", CONNECT)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def ours(engine: str) -> bool:
    """Our engines: ``state_runtime``, its Connect variant, the baseline tree's."""
    return engine.split("@")[0] in OURS


def sink_noop(output: Any, batch_id: int) -> None:
    output.write.format("noop").mode("overwrite").save()


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

    conf = {"spark.sql.streaming.stateStore.maintenanceInterval": "600s"}
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
        probe.watch(query.catalog.engine)
        process = query.foreach_batch(sink_noop)

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
    spark.stop()
    latencies = [p.durationMs["triggerExecution"] / 1000 for p in progress]
    result = {"latencies": latencies, "final_bytes": folder_bytes(state_dir), "sizes": sizes}
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
            }
            for m in sorted(recorded, key=lambda m: m.batch_id)
        ]
    return result


def child(args: argparse.Namespace) -> None:
    result = run_engine(
        args.engine,
        Path(args.work),
        Path(args.inputs),
        int(args.partitions),
        args.catalogs,
        args.pg,
    )
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
    parser.add_argument("--engine", help=argparse.SUPPRESS)
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
    spark.stop()
    engines = args.engines.split(",")
    if args.baseline_tree and "state_runtime@baseline" not in engines:
        engines.append("state_runtime@baseline")
    trees = {"state_runtime@baseline": args.baseline_tree}
    counts = [int(n) for n in str(args.partitions).split(",")]
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
                ],
                capture_output=True,
                text=True,
                cwd=tree,  # local Python workers put their working folder first on sys.path
                env=os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": tree},
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"{label} failed")
            results.setdefault(partitions, {}).setdefault(label, []).append(
                json.loads(line[len("RESULT ") :])
            )
            shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    for partitions, found in results.items():
        report(found, args, partitions)
    if len(results) > 1:
        summary(results, args)
    plot(results[counts[0]], args.plot)


def figures(rounds: list[dict[str, Any]], batches: int) -> dict[str, float]:
    """First batch (builds the state), median and p90 of the update batches, bytes per batch;
    with several rounds, the update batches of all rounds pooled and the medians of the rest.
    For our engines also the catalog's work (see the module docstring)."""
    updates = [x for r in rounds for x in r["latencies"][1:]]

    def grown(r: dict[str, Any]) -> float:
        sizes = {int(k): v for k, v in r["sizes"].items()}
        first = sizes.get(1, sizes.get(min(sizes)) if sizes else 0)
        return float(r["final_bytes"] - first) / max(1, batches - 1)

    found = {
        "first": statistics.median(r["latencies"][0] for r in rounds),
        "median": statistics.median(updates),
        "p90": sorted(updates)[int(0.9 * (len(updates) - 1))],
        "bytes": statistics.median(grown(r) for r in rounds),
    }
    txns = [t for r in rounds for t in r.get("txns_per_batch", [])[1:]]
    if txns:
        found["txns"] = statistics.median(txns)
        found["txns_max"] = max(txns)
    if any("pg_xact_per_batch" in r for r in rounds):
        found["pg_xact"] = statistics.median(r["pg_xact_per_batch"] for r in rounds)
        found["pg_peak"] = max(r["pg_peak_connections"] for r in rounds)
    return found


def _empty_delta_bytes() -> int:
    """The bytes of a format 3 delta holding no row: the fixed cost of one file."""
    import numpy as np
    from bench_delta_bytes import sizes

    empty = np.array([], dtype=np.int64)
    return sizes(0, empty, empty)[1]


def _catalog_cells(f: dict[str, float]) -> str:
    txns = f"{f['txns']:.0f} (max {f['txns_max']:.0f})" if "txns" in f else ""
    xact = f"{f['pg_xact']:.1f}" if "pg_xact" in f else ""
    peak = f"{f['pg_peak']:.0f}" if "pg_peak" in f else ""
    return f"{txns} | {xact} | {peak}"


def report(
    results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, partitions: int
) -> None:
    print(
        f"\nmachine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.2f} at the end; local[2], "
        f"{partitions} partitions, {args.keys:,} keys, {args.updates:,} updates/batch, "
        f"{args.batches} batches, {args.rounds} round(s)"
    )
    rows = {engine: figures(r, args.batches) for engine, r in results.items()}
    base = rows.get(BASELINE)
    print(
        "\n| engine | first batch | median | p90 | bytes per batch "
        f"| vs {BASELINE} (median, p90, bytes) | catalog txns per batch (driver) "
        "| PG xact_commit per batch (all processes) | peak PG connections |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
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
            f"| {f['bytes'] / 1024:.1f} KiB | {ratio} | {_catalog_cells(f)} |"
        )
    mine = [label for label in rows if label.split("[")[0] == "state_runtime"]
    ours_row = rows[mine[0]] if mine else None
    connect = next((rows[label] for label in rows if label.startswith(CONNECT)), None)
    if ours_row is not None and connect is not None:
        median, p90 = connect["median"] / ours_row["median"], connect["p90"] / ours_row["p90"]
        print(
            f"\n{CONNECT} vs state_runtime (classic) in this run: median {median:.2f}x, "
            f"p90 {p90:.2f}x; target median <= 1.2x -> {'met' if median <= 1.2 else 'NOT met'}"
        )
    for label in mine:
        f = rows[label]
        print(f"\ntargets, {label} in this run:")
        if base is not None:
            for what, value, goal in (
                ("median <= 0.8x RocksDB's (stretch 0.5x)", f["median"] / base["median"], 0.8),
                ("p90 <= RocksDB's p90", f["p90"] / base["p90"], 1.0),
                ("bytes <= 1/3 of RocksDB's", f["bytes"] / base["bytes"], 1 / 3),
            ):
                print(f"  {what}: {value:.2f}x -> {'met' if value <= goal else 'NOT met'}")
            stores = min(partitions, args.updates)  # each changed store writes one delta
            floor = stores * _empty_delta_bytes()
            print(
                f"  (one delta per changed store: {stores} files x {_empty_delta_bytes()} B "
                f"before any row = {floor / 1024:.1f} KiB; 1/3 of RocksDB's is "
                f"{base['bytes'] / 3 / 1024:.1f} KiB)"
            )
        if "txns" in f:
            print(
                f"  catalog transactions per batch <= 3: {f['txns_max']:.0f} -> "
                f"{'met' if f['txns_max'] <= 3 else 'NOT met'}"
            )
        if PANDAS in rows:
            speedup = rows[PANDAS]["median"] / f["median"]
            print(
                f"  >= 10x faster than {PANDAS} (median): {speedup:.1f}x -> "
                f"{'met' if speedup >= 10 else 'NOT met'}"
            )
        warm = results[label][0].get("warm", [])[1:]  # the first round's
        if warm:
            hits = statistics.mean(w["hit_rate"] for w in warm)
            loads = [w["max_load_ms"] for w in warm]
            print(
                f"  warm copies (update batches of round 1): cache hit rate {hits:.0%}; "
                f"slowest load per batch: median {statistics.median(loads):.0f} ms, "
                f"max {max(loads):.0f} ms"
            )


def summary(results: dict[int, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    """One line per (partitions, engine) and a plot of median and transactions per batch."""
    print(
        "\n| partitions | engine | median | p90 | bytes per batch | median vs RocksDB "
        "| txns per batch (driver) | PG xact per batch | peak PG connections |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    table: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for partitions, found in sorted(results.items()):
        rows = {engine: figures(r, args.batches) for engine, r in found.items()}
        base = rows.get(BASELINE)
        for engine, f in rows.items():
            ratio = "" if base is None else f"{f['median'] / base['median']:.2f}x"
            print(
                f"| {partitions} | {engine} | {f['median']:.2f} s | {f['p90']:.2f} s "
                f"| {f['bytes'] / 1024:.1f} KiB | {ratio} | {_catalog_cells(f)} |"
            )
            table.setdefault(engine, []).append((partitions, f))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for engine, points in table.items():
        xs = [x for x, _ in points]
        ax1.plot(xs, [f["median"] for _, f in points], marker="o", label=engine)
        ax2.plot(xs, [f["bytes"] / 1024 for _, f in points], marker="o", label=engine)
        if all("pg_xact" in f or "txns" in f for _, f in points):
            counted = [f.get("pg_xact", f.get("txns", 0.0)) for _, f in points]
            ax3.plot(xs, counted, marker="o", label=engine)
    ax1.set(title="median batch time", xlabel="partitions", ylabel="seconds")
    ax2.set(title="checkpoint bytes per batch", xlabel="partitions", ylabel="KiB")
    ax3.set(
        title="catalog transactions per batch\n(PG: xact_commit, else driver)",
        xlabel="partitions",
        ylabel="transactions",
    )
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = str(Path(args.plot).with_name(Path(args.plot).stem + "-partitions.png"))
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


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
