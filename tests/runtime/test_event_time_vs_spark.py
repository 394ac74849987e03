"""Our windowed aggregation against Spark's own streaming aggregation with a watermark, batch
by batch on the same data: same output rows in update and append mode."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.runtime import StatefulQuery, Watermark, Window

from .test_event_time import (
    EVENTS,
    GAP_MS,
    _batch_events,
    _df,
    _output,
    _sessions_op,
    _ts,
    _windowed,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("mode", "window"),
    [
        ("update", Window(timedelta(seconds=10), timedelta(seconds=5))),
        ("append", Window(timedelta(seconds=10))),
    ],
)
def test_windowed_aggregation_equals_sparks_streaming_aggregation(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, mode: str, window: Window
) -> None:
    # Spark runs extra batches without data when the watermark moves; a foreachBatch query
    # runs the batches it is given, so Spark's side runs with those turned off.
    session = spark.newSession()
    session.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    inbox = tmp_path / "in"
    inbox.mkdir()
    size, slide = (int(d.total_seconds()) for d in (window.size, window.slide_or_size))
    theirs: dict[int, Any] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        theirs[batch_id] = _output(df.collect())

    stream = (
        session.readStream.schema(EVENTS)
        .option("maxFilesPerTrigger", 1)
        .json(str(inbox))
        .withWatermark("ts", "5 seconds")
        .groupBy("user", F.window("ts", f"{size} seconds", f"{slide} seconds"))
        .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
        .writeStream.outputMode(mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
        .start()
    )
    ours = StatefulQuery(
        "vs-spark",
        str(tmp_path / "ckpt"),
        [_windowed(mode, window)],
        catalog_url=sqlite_catalog_url,
        watermark=Watermark("ts", timedelta(seconds=5)),
    )
    rng = random.Random(23)
    batches = [_batch_events(rng, b) for b in range(5)] + [[("u0", 200_000_000, 0)]]
    batches.append([("u1", 201_000_000, 1)])  # the watermark jumped: every window closes
    emitted = 0
    try:
        for batch_id, events in enumerate(batches):
            lines = [
                json.dumps({"user": u, "ts": _ts(t).isoformat(), "amount": a}) for u, t, a in events
            ]
            (inbox / f"{batch_id:03d}.json").write_text("\n".join(lines) + "\n")
            stream.processAllAvailable()
            result = ours.run_batch(_df(spark, events), batch_id)
            assert _output(result.output.collect()) == theirs[batch_id], batch_id
            emitted += len(theirs[batch_id])
            result.release()
    finally:
        stream.stop()
    assert emitted > 0 and len(theirs) == len(batches)


def _spark_session_fn(key: tuple[Any, ...], frames: Any, state: Any) -> Any:
    """``_session`` of test_event_time for Spark's ``applyInPandasWithState``."""
    import pandas as pd

    if state.hasTimedOut:
        n, _ = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "n": [n], "closed": [True]})
        return
    n, last = state.get if state.exists else (0, 0)
    for frame in frames:
        n += len(frame)
        last = max(last, int(frame["ts"].max().timestamp() * 1000))
    state.update((n, last))
    state.setTimeoutTimestamp(last + GAP_MS)
    yield pd.DataFrame({"user": [key[0]], "n": [n], "closed": [False]})


def test_event_time_timeouts_equal_sparks_apply_in_pandas_with_state(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    from pyspark.sql.streaming.state import GroupStateTimeout

    session = spark.newSession()
    session.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    inbox = tmp_path / "in"
    inbox.mkdir()
    theirs: dict[int, set[tuple[Any, ...]]] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        theirs[batch_id] = {(r.user, r.n, r.closed) for r in df.collect()}

    stream = (
        session.readStream.schema(EVENTS)
        .option("maxFilesPerTrigger", 1)
        .json(str(inbox))
        .withWatermark("ts", "2 seconds")
        .groupBy("user")
        .applyInPandasWithState(
            _spark_session_fn,
            "user string, n long, closed boolean",
            "n long, last long",
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
        .writeStream.outputMode("append")
        .foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
        .start()
    )
    ours = StatefulQuery(
        "sessions-vs-spark",
        str(tmp_path / "ckpt"),
        [_sessions_op()],
        catalog_url=sqlite_catalog_url,
        watermark=Watermark("ts", timedelta(seconds=2)),
    )
    rng = random.Random(5)
    batches: list[list[tuple[str, int, int]]] = []
    for b in range(6):
        users = [f"u{i}" for i in range(6) if rng.random() < 0.5] if b % 2 == 0 else ["u0"]
        batches.append([(u, (15 * b + rng.randrange(8)) * 1_000_000, 1) for u in users] * 2)
    batches += [[("late", 1_000_000, 1)], [("u5", 200_000_000, 1)], [("u5", 201_000_000, 1)]]
    closed = 0
    try:
        for batch_id, events in enumerate(batches):
            lines = [
                json.dumps({"user": u, "ts": _ts(t).isoformat(), "amount": a}) for u, t, a in events
            ]
            (inbox / f"{batch_id:03d}.json").write_text("\n".join(lines) + "\n")
            stream.processAllAvailable()
            result = ours.run_batch(_df(spark, events), batch_id)
            got = {(r.user, r.n, r.closed) for r in result.output.collect()}
            assert got == theirs[batch_id], batch_id
            closed += sum(1 for *_, c in got if c)
            result.release()
    finally:
        stream.stop()
    assert closed > 0
