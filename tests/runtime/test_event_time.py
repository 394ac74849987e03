"""Event time on a real Spark session: watermarks, windows, event-time timeouts, eviction,
replays and a restart, against the plain-Python reference of Spark's semantics."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument
from state_runtime.runtime import (
    Agg,
    GroupState,
    StatefulQuery,
    Watermark,
    Window,
    map_groups_with_state,
    read_state,
    windowed_aggregation,
)

from .reference import SessionTimeoutReference, WindowedCountReference, assert_lineage_linear

pytestmark = [pytest.mark.spark, pytest.mark.connect]

S = 1_000_000  # microseconds per second
EVENTS = "user string, ts timestamp, amount bigint"


def _ts(us: int) -> datetime:
    return datetime.fromtimestamp(us / S, tz=UTC)


def _us(dt: datetime) -> int:
    return round(dt.timestamp() * S)


def _batch_events(rng: random.Random, batch: int, n: int = 40) -> list[tuple[str, int, int]]:
    """Events around second ``20 * batch``, some out of order and some far behind (late)."""
    events = []
    for _ in range(n):
        base = 20 * batch * S + rng.randrange(-15 * S, 5 * S)
        if rng.random() < 0.15:
            base -= 60 * S  # behind the watermark once it has moved
        events.append((f"u{rng.randrange(4)}", max(base, S), rng.randrange(10)))
    return events


def _df(spark: SparkSession, events: list[tuple[str, int, int]]) -> DataFrame:
    df = spark.createDataFrame([(u, _ts(t), a) for u, t, a in events], EVENTS)
    return df.repartition(2) if events else df


def _windowed(mode: str, window: Window) -> Any:
    return windowed_aggregation(
        0,
        ["user"],
        "user string",
        "ts",
        window,
        [Agg("n", "count"), Agg("total", "sum", "amount")],
        3,
        output_mode=mode,  # type: ignore[arg-type]
    )


def _output(rows: list[Any]) -> dict[tuple[str, int], tuple[int, int]]:
    return {(r.user, _us(r.window.start)): (r.n, r.total) for r in rows}


@pytest.mark.parametrize(
    ("mode", "window"),
    [
        ("update", Window(timedelta(seconds=10), timedelta(seconds=5))),
        ("append", Window(timedelta(seconds=10))),
    ],
)
def test_windowed_aggregation_matches_spark_semantics_across_replay_and_restart(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, mode: str, window: Window
) -> None:
    root = str(tmp_path / "ckpt")
    mark = Watermark("ts", timedelta(seconds=5))
    size = window.size // timedelta(microseconds=1)
    slide = window.slide_or_size // timedelta(microseconds=1)
    reference = WindowedCountReference(size, slide, 5000, mode)
    rng = random.Random(11)
    query = StatefulQuery(
        "windows", root, [_windowed(mode, window)], catalog_url=sqlite_catalog_url, watermark=mark
    )
    catalog = Catalog.open(sqlite_catalog_url)
    batches = [_batch_events(rng, b) for b in range(4)] + [[]]  # an empty batch closes windows
    total_late = emitted = 0
    for batch_id, events in enumerate(batches):
        watermarks = (reference.watermark.current_ms, reference.watermark.previous_ms)
        expected, late = reference.run_batch(events)
        result = query.run_batch(_df(spark, events), batch_id)
        assert _output(result.output.collect()) == expected, batch_id
        extra = result.metrics.extra
        assert (extra["watermark_ms"], extra["late_rows_watermark_ms"]) == watermarks
        assert extra["late_rows"] == late
        total_late += late
        emitted += len(expected)
        if mode == "append":
            assert extra["evicted"] == len(expected)
        result.release()
    assert total_late > 0 and emitted > 0  # the data really had late rows and output

    # A replay of the last batch, with another clock, uses the recorded watermark.
    last = len(batches) - 1
    recorded = catalog.batch_watermark(query.root, "windows", last)
    replayed = query.run_batch(_df(spark, []), last, batch_time_ms=10**13)
    assert replayed.metrics.extra["watermark_ms"] == recorded.watermark_ms  # type: ignore[union-attr]
    replayed.release()

    # A restart: a new query object in a new Spark session continues where the first stopped.
    restarted = StatefulQuery(
        "windows",
        root,
        [_windowed(mode, window)],
        catalog_url=sqlite_catalog_url,
        watermark=mark,
    )
    session = spark.newSession()
    for batch_id in range(len(batches), len(batches) + 2):
        events = _batch_events(rng, batch_id)
        watermark_before = reference.watermark.current_ms
        expected, late = reference.run_batch(events)
        result = restarted.run_batch(_df(session, events), batch_id)
        assert _output(result.output.collect()) == expected, batch_id
        assert result.metrics.extra["watermark_ms"] == watermark_before
        assert result.metrics.extra["late_rows"] == late
        result.release()

    state = read_state(spark, root, 0, catalog_url=sqlite_catalog_url).collect()
    assert {(r.key.user, _us(r.key.window_start)): (r.value.n, r.value.total) for r in state} == (
        reference.state
    )
    recorded_metrics = catalog.batch_metrics(query.root, "windows")
    assert all("evict_ms" in m.metrics.extra for m in recorded_metrics)
    assert assert_lineage_linear(catalog, query.storage) > 0
    catalog.close()


GAP_MS = 10_000


def _session(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState) -> Any:
    """Count a user's events; the session closes 10 s (event time) after its latest event."""
    if state.has_timed_out:
        return [(key[0], state.get()[0], True)]  # type: ignore[index]
    n, last = state.get() or (0, 0)
    latest = max(_us(r[1]) // 1000 for r in rows)
    last = max(last, latest)
    state.update((n + len(rows), last))
    state.set_timeout_timestamp(last + GAP_MS)
    return [(key[0], n + len(rows), False)]


def _sessions_op() -> Any:
    return map_groups_with_state(
        0,
        ["user"],
        "user string",
        "n bigint, last_ms bigint",
        "user string, n bigint, closed boolean",
        _session,
        2,
        timeout="event_time",
        event_time_column="ts",
    )


def test_event_time_timeouts_fire_once_when_the_watermark_passes(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    op = _sessions_op()
    query = StatefulQuery(
        "sessions",
        str(tmp_path / "ckpt"),
        [op],
        catalog_url=sqlite_catalog_url,
        watermark=Watermark("ts", timedelta(seconds=2)),
    )
    reference = SessionTimeoutReference(GAP_MS, 2000)
    rng = random.Random(5)
    batches: list[list[tuple[str, int]]] = []
    for b in range(6):
        if b in (3, 5):
            batches.append([])  # empty batches: timeouts still fire
            continue
        users = [f"u{i}" for i in range(6) if rng.random() < 0.5]
        batches.append([(u, (15 * b + rng.randrange(8)) * S) for u in users for _ in range(2)])
    batches.append([("late", S)])  # far behind the watermark: dropped
    closed: list[str] = []
    for batch_id, events in enumerate(batches):
        expected, late = reference.run_batch(events)
        result = query.run_batch(_df(spark, [(u, t, 1) for u, t in events]), batch_id)
        got = {(r.user, r.n, r.closed) for r in result.output.collect()}
        assert got == expected, batch_id
        assert result.metrics.extra["late_rows"] == late
        closed.extend(u for u, _, c in got if c)
        assert result.metrics.extra["evicted"] == sum(1 for *_, c in got if c)
        result.release()
    assert closed and len(closed) == len(set(closed))  # each session closed exactly once


def test_event_time_operators_need_a_watermark(tmp_path: Path, sqlite_catalog_url: str) -> None:
    with pytest.raises(InvalidArgument, match="needs a watermark"):
        StatefulQuery(
            "w",
            str(tmp_path / "ckpt"),
            [_windowed("append", Window(timedelta(seconds=10)))],
            catalog_url=sqlite_catalog_url,
        )


def test_late_rows_count_once_in_an_operator_of_several_stores(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """``transform_with_state`` keeps each variable in a store beside its timers: every
    store's task report carried the partition's late rows (3 late rows counted 6)."""
    from .differential import EVENTS as TWS_EVENTS
    from .differential import Stream
    from .tws_processors import FraudDetector, tws_operator

    operator = tws_operator("FraudDetector", FraudDetector, "EventTime")
    stream = Stream([], "UTC", 0, 4, 4, "update", None)
    ops, mark = operator.ours(stream)
    query = StatefulQuery(
        "late", str(tmp_path / "ckpt"), ops, catalog_url=sqlite_catalog_url, watermark=mark
    )
    batches = [[("a", 10)], [("b", 10)], [("a", 1), ("a", 1), ("c", 2)]]
    for batch_id, events in enumerate(batches):
        rows = [(0, user, _ts(at * S), 9) for user, at in events]
        df = operator.prepare(spark.createDataFrame(rows, TWS_EVENTS), stream)
        result = query.run_batch(df, batch_id)
        late = result.metrics.extra["late_rows"]
        result.release()
    assert late == 3
