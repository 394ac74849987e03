"""``make demo``: a real streaming job on embedded defaults.

Each run generates ``--batches`` files of click events and streams them, one file per
micro-batch, through a running count and sum of amounts per user kept in ``state_runtime``
stores (``foreachBatch``). The stream is finite (``availableNow``): it stops by itself after the
last file, never by interrupting a batch in flight. (Stopping a query while its foreachBatch
function is inside a Spark call makes Spark match a long Py4J error message against a
backtracking regex, which overflows the stream thread's stack: the ~1,000-line
``StackOverflowError`` the demo used to print.)

Each run lives in its own folder, ``demo-output/runs/<started>/`` (events, state files, Spark's
checkpoint); the catalog is ``$STATE_CATALOG_URL`` or the SQLite file ``demo-output/catalog.db``.
Running the demo again resumes the newest run (new event files, the same stores) when the
catalog knows it and its Spark checkpoint is there; otherwise it starts a new run folder. It
never reuses a checkpoint root the catalog knows with its files gone. Each batch prints a
progress line; the end prints a summary and what to open next.

A failure ends the demo with one paragraph on stderr, as ``statestore`` prints it (our error's
code, what happened, the store and file, the next command) and exit code 1; the full trace,
and everything Spark's JVM printed, go to ``<output>/demo.log`` (``--verbose``: to the
terminal as well). The catalog is opened before Spark starts: a bad catalog URL or a database
that is down is said at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.catalog import BatchMetrics, Catalog, catalog_url
from state_runtime.failures import ends_in_paragraph, quiet_warnings
from state_runtime.redaction import RedactingFilter
from state_runtime.runtime import Agg, StatefulQuery, read_state, running_aggregation
from state_runtime.runtime.spark_kind import is_connect
from state_runtime.runtime.spark_session import spark_session

QUERY_ID = "clicks_per_user"


def say(*parts: object) -> None:
    """Print a line; once stdout is a closed pipe (``make demo | head``), print nothing more
    and go on: a batch must not fail, nor Python end with a traceback, because a reader
    stopped reading."""
    try:
        print(*parts, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def choose_run(output: Path, catalog: Catalog) -> tuple[Path, bool]:
    """The run folder to use and whether it resumes: the newest run if the catalog knows its
    state and its Spark checkpoint is there, else a new folder no catalog entry names."""
    runs = sorted((output / "runs").glob("*")) if (output / "runs").is_dir() else []
    if runs:
        newest = runs[-1]
        known = catalog.stores((newest / "checkpoint").absolute().as_uri())
        if known and (newest / "spark-checkpoint" / "offsets").is_dir():
            return newest, True
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run, n = output / "runs" / stamp, 1
    while run.exists() or catalog.stores((run / "checkpoint").absolute().as_uri()):
        n += 1
        run = output / "runs" / f"{stamp}-{n}"
    return run, False


def write_events(folder: Path, batches: int, events_per_batch: int, users: int) -> None:
    """``batches`` new Parquet files of click events (user, amount) after those in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    first = len(list(folder.glob("*.parquet")))
    for n in range(first, first + batches):
        rng = np.random.default_rng(n)
        user = rng.zipf(1.3, events_per_batch) % users  # a few busy users, a long tail
        pq.write_table(
            pa.table(
                {
                    "user": pa.array([f"user{u}" for u in user.tolist()]),
                    "amount": pa.array(rng.integers(0, 97, events_per_batch)),
                }
            ),
            folder / f"events-{n:05d}.parquet",
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10, help="micro-batches to run")
    parser.add_argument("--events-per-batch", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--output", type=Path, default=Path("demo-output"))
    parser.add_argument(
        "--catalog-url", help="default: $STATE_CATALOG_URL, else <output>/catalog.db"
    )
    parser.add_argument(
        "--max-amount",
        action="store_true",
        help="also keep each user's largest amount (a schema change when resuming a run "
        "without it: users not seen since read it as null)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print Spark's output and a failure's full trace (always in <output>/demo.log)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> None:
    """The demo, ending a failure with its one paragraph (exit code 1), the trace in the log.
    ``spark``: a running session to use (and leave running); by default the demo starts its
    own and stops it at the end."""
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    log = (args.output / "demo.log").absolute()
    _log_to(log, args.verbose)
    # pyspark's warnings are not the user's business
    with ends_in_paragraph(log=log, verbose=args.verbose), quiet_warnings():
        # Creates an embedded SQLite catalog (a PostgreSQL one is created by its owner:
        # no DDL here); opened before Spark starts, so that a bad URL or a database down
        # fails at once
        Catalog.open(args.catalog_url or catalog_url(args.output), upgrade="sqlite").close()
        if spark is not None:
            run(spark, args)
            return
        own = spark_session(
            "local[2]",
            app_name="state-runtime-demo",
            shuffle_partitions=args.partitions,
            log_file=Path("/dev/stderr") if args.verbose else log,
        )
        try:
            run(own, args)
        finally:
            own.stop()


def batch_line(batch_id: int, m: BatchMetrics, seconds: float) -> str:
    return (
        f"batch {batch_id:>3}: {m.rows_in:>7,} events, {m.keys_updated:>6,} users updated, "
        f"{m.state_rows:>7,} users in state, {m.bytes_written / 1024:>6.1f} KiB written, "
        f"cache {m.cache_hits}/{m.cache_hits + m.cache_misses} hits, {seconds:.2f} s"
    )


def _log_to(log: Path, verbose: bool) -> None:
    """Every logger's warnings (a retried catalog call, py4j's at shutdown) to ``log``, masked;
    also to the terminal with ``verbose``."""
    handlers: list[logging.Handler] = [logging.FileHandler(log, encoding="utf-8")]
    if verbose:
        handlers.append(logging.StreamHandler())
    for handler in handlers:
        handler.addFilter(RedactingFilter())
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
    )


def run(spark: SparkSession, args: argparse.Namespace) -> list[int]:
    """Run (or resume) the demo stream for ``args.batches`` batches; the batch ids run."""
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    url = args.catalog_url or catalog_url(output)
    with Catalog.open(url, upgrade="sqlite") as catalog:
        folder, resumed = choose_run(output, catalog)
    root = str((folder / "checkpoint").absolute())
    say(
        f"{'resuming' if resumed else 'new run'}: {folder}\n"
        f"checkpoint root: {root}\ncatalog:         {url}"
    )
    op = running_aggregation(
        0,
        ["user"],
        "user string",
        [Agg("clicks", "count"), Agg("amount", "sum", "amount")]
        + ([Agg("max_amount", "max", "amount")] if args.max_amount else []),
        args.partitions,
    )
    spark_checkpoint = str((folder / "spark-checkpoint").absolute())
    query = StatefulQuery(QUERY_ID, root, [op], catalog_url=url, spark_checkpoint=spark_checkpoint)
    started = time.perf_counter()
    counted: dict[int, int] = {}

    def sink(updated: DataFrame, batch_id: int) -> None:
        counted[batch_id] = updated.count()

    def process(df: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        result = query.run_batch(df, batch_id, sink=sink)
        result.release()
        say(batch_line(batch_id, result.metrics, time.perf_counter() - t0))

    write_events(folder / "events", args.batches, args.events_per_batch, args.users)
    stream = (
        spark.readStream.schema("user string, amount bigint")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(folder / "events"))
        .writeStream.foreachBatch(process)
        .option("checkpointLocation", spark_checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()  # a failure: main shows its one paragraph
    # From Spark's progress, not from ``process``: on Spark Connect ``process`` runs in the
    # server's foreachBatch worker, whose lines go to the server's log, not this terminal:
    # the catalog's figures of those batches stand in for them.
    done = sorted({p.batchId for p in stream.recentProgress if p.numInputRows})
    if is_connect(spark) and done:
        with Catalog.open(url) as catalog:
            recorded = catalog.batch_metrics(query.root, QUERY_ID, limit=len(done))
        for r in sorted(recorded, key=lambda r: r.batch_id):
            say(batch_line(r.batch_id, r.metrics, float(r.metrics.extra.get("batch_ms", 0)) / 1000))

    state = read_state(spark, root, 0, catalog_url=url)
    top = state.orderBy(F.col("value.clicks").desc()).limit(3).collect()
    files = list((folder / "checkpoint").rglob("*.delta"))
    with Catalog.open(url) as catalog:
        latest = catalog.latest_committed(query.root)
    say(
        f"\ndone: {len(done)} batches in {time.perf_counter() - started:.0f} s; "
        f"{state.count():,} users in state across {len(latest)} stores, "
        f"versions {sorted({r.version for r in latest.values()})}, "
        f"{len(files)} delta files, {sum(f.stat().st_size for f in files) / 1024:.0f} KiB"
    )
    say("top users:", ", ".join(f"{r.key.user}={r.value.clicks}" for r in top))
    say(
        "\nnext:\n"
        "  make demo                         run again: resumes this run\n"
        "  make demo-maintain                snapshots, cleanup and validation on these stores\n"
        "  make dagster                      the Dagster UI on these stores\n"
        "  sql/store_health.sql              the operators' queries (psql on PostgreSQL)\n"
        "  .venv/bin/statestore health       store health from the command line\n"
        f"  read_state(spark, '{root}', 0)    the state as a DataFrame (see README)"
    )
    return done


if __name__ == "__main__":
    main()
