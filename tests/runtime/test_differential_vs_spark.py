"""Differential tests: hypothesis streams through our operators and through Spark's own
streaming engine, every batch's output compared (the harness: ``differential.py``).

``DIFF_STREAMS`` sets the streams per operator (``make fuzz-spark`` runs thousands; the
default is in :func:`_examples`);
``DIFF_SAVE`` names a folder where every diverging stream is saved as JSON. The streams run
and divergences found per operator are printed at the end of the session."""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql import SparkSession

from .differential import (
    EPOCH_S,
    OPERATORS,
    TIMES,
    Divergence,
    Stream,
    packed,
    run_stream,
    streams,
)

pytestmark = pytest.mark.spark

STREAMS = os.environ.get("DIFF_STREAMS")
SAVE = os.environ.get("DIFF_SAVE")
_RUN: Counter[str] = Counter()
_DIVERGED: Counter[str] = Counter()
_IDS = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\ndifferential seconds: ours {TIMES['ours']:.0f}, spark {TIMES['spark']:.0f}")
        for name in OPERATORS:
            print(f"differential {name}: {_RUN[name]} streams run, {_DIVERGED[name]} diverged")


@pytest.fixture(scope="module")
def catalog_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One catalog for every stream (each has its own checkpoint root)."""
    return f"sqlite:///{tmp_path_factory.mktemp('diff') / 'catalog.db'}"


def _check(
    spark: SparkSession, catalog_url: str, name: str, stream: Stream, packed: int = 1
) -> None:
    """Run ``stream`` (``packed`` independent streams in one query) through both engines."""
    folder = Path(tempfile.mkdtemp(prefix=f"diff-{name}-"))
    operator = OPERATORS[name]
    _RUN[name] += packed
    try:
        run_stream(spark, operator, stream, folder, catalog_url)
    except Divergence as divergence:
        _DIVERGED[name] += 1
        if SAVE:
            Path(SAVE).mkdir(parents=True, exist_ok=True)
            (Path(SAVE) / f"{name}-{os.getpid()}-{next(_IDS)}.json").write_text(
                json.dumps({"operator": name, "stream": json.loads(stream.to_json())})
            )
        raise AssertionError(str(divergence)) from None


def _examples(operator: str) -> int:
    """Queries to run for ``DIFF_STREAMS`` streams of ``operator``; by default 50 streams of
    an operator that packs 10 into a query, 12 of the others (each is its own Spark query,
    15 to 25 s on the shared machine)."""
    pack = OPERATORS[operator].pack
    streams = int(STREAMS) if STREAMS else (50 if pack > 1 else 12)
    return -(-streams // pack)


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


@settings(max_examples=_examples("running_aggregation"), **SETTINGS)  # type: ignore[arg-type]
@given(stream=packed(OPERATORS["running_aggregation"].pack))
def test_running_aggregation_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "running_aggregation", stream, OPERATORS["running_aggregation"].pack)


@settings(max_examples=_examples("windowed_aggregation"), **SETTINGS)  # type: ignore[arg-type]
@given(stream=streams())
def test_windowed_aggregation_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "windowed_aggregation", stream)


@settings(max_examples=_examples("event_time_timeouts"), **SETTINGS)  # type: ignore[arg-type]
@given(stream=streams())
def test_event_time_timeouts_equal_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "event_time_timeouts", stream)


@settings(max_examples=_examples("drop_duplicates"), **SETTINGS)  # type: ignore[arg-type]
@given(stream=streams())
def test_drop_duplicates_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "drop_duplicates", stream)


@settings(max_examples=_examples("drop_duplicates_within_watermark"), **SETTINGS)  # type: ignore[arg-type]
@given(stream=streams())
def test_drop_duplicates_within_watermark_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "drop_duplicates_within_watermark", stream)


T0 = EPOCH_S * 1000
NULLS = Stream(
    batches=[
        [(0, "a", T0, 1), (0, None, T0 + 1000, 2), (0, "a", None, 3), (0, None, None, 4)],
        [],
        [(0, "b", None, 5), (0, "a", T0 + 30_000, 6), (0, "a", T0 + 30_000, 6)],
        [(0, None, T0 + 90_000, 7), (0, "a", T0 + 500, 8), (0, "b", None, 9)],
    ],
    zone="America/Los_Angeles",
    delay_s=2,
    size_s=10,
    slide_s=5,
    mode="append",
    restart_at=2,
)
"""A fixed stream of null event times and null keys, a duplicate, an empty batch, a late row
and a watermark jump, with a restart: every operator's nulls as Spark's."""


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_null_times_and_keys_equal_sparks(spark: SparkSession, catalog_url: str, name: str) -> None:
    _check(spark, catalog_url, name, NULLS)
