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

from .differential import OPERATORS, TIMES, Divergence, Stream, packed, run_stream, streams

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


def _check(spark: SparkSession, catalog_url: str, name: str, stream: Stream) -> None:
    folder = Path(tempfile.mkdtemp(prefix=f"diff-{name}-"))
    operator = OPERATORS[name]
    _RUN[name] += operator.pack
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
    _check(spark, catalog_url, "running_aggregation", stream)


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
