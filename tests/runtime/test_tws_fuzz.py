"""Generated streams through ``transform_with_state`` and Spark's ``transformWithState``
(``make fuzz-tws``; skipped unless ``TWS_FUZZ_STREAMS`` is set, as each stream starts two
streaming queries): out-of-order, late and duplicated rows, null keys and times, empty
batches and restarts (the generator of tests/runtime/differential.py). The pandas forms'
comparison undoes the one documented difference a generated stream can show
(:func:`~.tws_processors.spark_null_key_as_ours`: a null key's timer reaches Spark's
processor as ``"NaN"``); the other documented null-key differences (null int or timestamp
keys) cannot occur in them: ``part`` is never null, no key is a timestamp."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from .differential import Stream, run_stream, streams
from .tws_processors import (
    Counters,
    FraudDetector,
    RowFraudDetector,
    Totals,
    spark_null_key_as_ours,
    tws_operator,
)

STREAMS = int(os.environ.get("TWS_FUZZ_STREAMS", "0"))
pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not STREAMS, reason="set TWS_FUZZ_STREAMS (make fuzz-tws)"),
]
CASES: list[tuple[type[StatefulProcessor], str]] = [
    (Counters, "None"),
    (Totals, "None"),
    (FraudDetector, "EventTime"),
    (RowFraudDetector, "EventTime"),
]


@pytest.mark.parametrize(("processor", "time_mode"), CASES, ids=[c[0].__name__ for c in CASES])
def test_generated_streams_equal_spark(
    spark: SparkSession, processor: type[StatefulProcessor], time_mode: str
) -> None:
    operator = tws_operator(processor.__name__, processor, time_mode)

    @settings(
        max_examples=max(STREAMS, 1),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(streams())
    def check(stream: Stream) -> None:
        with tempfile.TemporaryDirectory() as folder:
            catalog = f"sqlite:///{Path(folder) / 'catalog.db'}"
            outcome = run_stream(spark, operator, stream, Path(folder), catalog)
            if processor.pandas:  # type: ignore[attr-defined]
                outcome.theirs = {b: spark_null_key_as_ours(r) for b, r in outcome.theirs.items()}
            outcome.check()

    check()
