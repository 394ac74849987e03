"""Spark's own monitoring sees the state: each micro-batch's committed figures appear in the
streaming query's progress (``observedMetrics``), for a StreamingQueryListener and
``lastProgress``, on classic and on Connect sessions."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from state_runtime.catalog import Catalog
from state_runtime.runtime import (
    Agg,
    StatefulQuery,
    running_aggregation,
    state_figures,
    with_state_progress,
)
from state_runtime.runtime.spark_progress import FIELDS, SPARK_NAMES

pytestmark = [pytest.mark.spark, pytest.mark.connect]
SCHEMA = "user string, amount bigint"
BATCHES = 3


class Progresses(StreamingQueryListener):
    """The state figures of every progress event the listener bus delivers."""

    def __init__(self) -> None:
        self.figures: dict[int, dict[str, Any]] = {}

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        shown = state_figures(event.progress)
        if shown is not None:
            self.figures[event.progress.batchId] = shown

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _start(writer: Any, attempts: int = 5) -> Any:
    """Start the stream; on Connect, again when the server's foreachBatch worker missed
    Spark's fixed 10 s window to connect back (a loaded machine; nothing ran: see
    docs/runtime.md, "Starting the foreachBatch worker")."""
    for _ in range(1, attempts):
        try:
            return writer.start()
        except Exception as e:
            if "connect back" not in str(e):
                raise
    return writer.start()


def _noop(df: DataFrame, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def test_each_progress_shows_its_batch_state_figures(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    inbox = tmp_path / "inbox"
    rng = random.Random(7)
    for b in range(BATCHES):
        rows = [(f"user{rng.randrange(25)}", rng.randrange(100)) for _ in range(60 + 20 * b)]
        spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(inbox / f"f{b}"))
    root = str(tmp_path / "ckpt")
    op = running_aggregation(0, ["user"], "user string", [Agg("n", "count")], 3)
    query = StatefulQuery("watched", root, [op], catalog_url=sqlite_catalog_url, progress=True)
    listener = Progresses()
    spark.streams.addListener(listener)
    try:
        stream = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true")
            .parquet(str(inbox))
        )
        writer = (
            with_state_progress(stream)
            .writeStream.foreachBatch(query.foreach_batch(_noop))
            .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
            .trigger(availableNow=True)
        )
        running = _start(writer)
        assert running.awaitTermination(900), "the stream did not finish its three batches"
        last = running.lastProgress
        recent = running.recentProgress
        deadline = time.monotonic() + 60  # the listener bus delivers asynchronously
        while len(listener.figures) < BATCHES and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    with Catalog.open(sqlite_catalog_url) as catalog:
        recorded = {r.batch_id: r.metrics for r in catalog.batch_metrics(query.root, "watched")}
    assert sorted(recorded) == list(range(BATCHES))
    assert sorted(listener.figures) == list(range(BATCHES))
    for batch_id, metrics in recorded.items():
        shown = listener.figures[batch_id]
        assert set(shown) == {name for name, _ in FIELDS}
        assert shown["batch_id"] == batch_id
        assert shown["rows_in"] == metrics.rows_in == 60 + 20 * batch_id
        assert shown["state_rows"] == metrics.state_rows > 0
        assert shown["keys_updated"] == metrics.keys_updated
        assert shown["bytes_written"] == metrics.bytes_written > 0
        assert shown["commit_ms"] == pytest.approx(metrics.commit_ms)
        assert shown["cache_hits"] + shown["cache_misses"] == 3
        assert shown["watermark_ms"] is None and shown["late_rows"] is None  # no watermark
        # state on local disk, under Spark's names (in memory here: nothing on disk)
        assert {spark: shown[spark] for spark, _ in SPARK_NAMES} == {
            spark: getattr(metrics, name) for spark, name in SPARK_NAMES
        }
        assert shown["memoryUsedBytes"] > 0 and shown["rocksdbSstFileSize"] == 0
    # A Connect client's lastProgress/recentProgress hold the figures in another shape than a
    # listener's event (see state_figures); both read the same.
    assert last is not None
    assert last.batchId == BATCHES - 1
    assert state_figures(last) == listener.figures[BATCHES - 1]
    assert {p.batchId: state_figures(p) for p in recent} == listener.figures
