"""``transform_with_state`` against Spark's own ``transformWithStateInPandas`` and
``transformWithState`` (RocksDB), batch by batch on fixed streams, with the same processor
classes (tests/runtime/tws_processors.py), including a restart of both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from .differential import EPOCH_S, Event, Stream, run_stream
from .tws_processors import (
    Counters,
    FraudDetector,
    RowCounters,
    RowFraudDetector,
    RowSessionTracker,
    RowTotals,
    SessionTracker,
    Totals,
    tws_operator,
)

pytestmark = pytest.mark.spark

T0 = EPOCH_S * 1000


def _at(part: int, user: str | None, seconds: float | None, amount: int) -> Event:
    return (part, user, None if seconds is None else T0 + int(seconds * 1000), amount)


BATCHES: list[list[Event]] = [
    [_at(0, "a", 1, 7), _at(0, "b", 1, 7), _at(0, "a", 2, 1), _at(0, "c", 2, 3)],
    [_at(0, "a", 3, 2), _at(0, "b", 2.5, 0), _at(0, "c", 4, 9)],
    [],  # an idle batch: timers still fire
    [_at(0, "a", 9, 4), _at(0, "c", 4.5, 1), _at(0, "d", 10, 7), _at(0, "b", 10, 7)],
    [_at(0, "a", 30, 5), _at(0, "b", 12, 5), _at(0, "a", 30.5, 5)],
    [_at(0, "e", 60, 1)],
]
"""Keys a, b, c, d, e; amounts >= 7 open fraud windows; b cancels one with
a 0; c's and b's windows end at the same instant; the watermark jumps at batch 4."""


def _stream(restart_at: int | None) -> Stream:
    return Stream(BATCHES, "Europe/Paris", 2, 0, 0, "update", restart_at)


CASES: list[tuple[type[StatefulProcessor], str]] = [
    (SessionTracker, "ProcessingTime"),
    (RowSessionTracker, "ProcessingTime"),
    (Counters, "None"),
    (RowCounters, "None"),
    (FraudDetector, "EventTime"),
    (RowFraudDetector, "EventTime"),
    (Totals, "None"),
    (RowTotals, "None"),
]


@pytest.mark.parametrize(("processor", "time_mode"), CASES, ids=[c[0].__name__ for c in CASES])
def test_transform_with_state_equals_spark(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    processor: type[StatefulProcessor],
    time_mode: str,
) -> None:
    operator = tws_operator(processor.__name__, processor, time_mode)
    outcome = run_stream(spark, operator, _stream(3), tmp_path, sqlite_catalog_url)
    assert outcome.check() == len(BATCHES)
