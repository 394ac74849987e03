"""Differential tests: hypothesis streams through our operators and through Spark's own
streaming engine, every batch's output compared (the harness: ``differential.py``).

``DIFF_STREAMS`` sets the streams per operator (default 20; ``make fuzz-spark`` runs
thousands), ``DIFF_RESTARTS`` the examples of the new-driver-process restart test (default 2,
each one stream of four operators); ``DIFF_SAVE`` names a folder where every diverging
stream is saved as JSON. The streams run and divergences found per operator are printed at
the end of the session."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from .differential import (
    EPOCH_S,
    OPERATORS,
    PACK,
    TIMES,
    Divergence,
    Stream,
    packed,
    run_stream,
)
from .resume import Resume, resume_elsewhere

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STREAMS = os.environ.get("DIFF_STREAMS")
SAVE = os.environ.get("DIFF_SAVE")
_RUN: Counter[str] = Counter()
_DIVERGED: Counter[str] = Counter()
_QUERIES: Counter[str] = Counter()
_IDS = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(
            f"\ndifferential seconds: ours {TIMES['ours']:.0f}, spark {TIMES['spark']:.0f}, "
            f"new driver processes {TIMES['resume']:.0f}"
        )
        for name in [*OPERATORS, *(f"{n} (new driver)" for n in RESTARTED)]:
            print(
                f"differential {name}: {_RUN[name]} streams run in {_QUERIES[name]} queries, "
                f"{_DIVERGED[name]} diverged"
            )


@pytest.fixture(scope="module")
def catalog_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One catalog for every stream (each has its own checkpoint root)."""
    return f"sqlite:///{tmp_path_factory.mktemp('diff') / 'catalog.db'}"


def _check(
    spark: SparkSession, catalog_url: str, name: str, stream: Stream, packed: int = 1
) -> None:
    """Run ``stream`` (``packed`` generated streams in one query) through both engines."""
    folder = Path(tempfile.mkdtemp(prefix=f"diff-{name}-"))
    _RUN[name] += packed
    _QUERIES[name] += 1
    try:
        run_stream(spark, OPERATORS[name], stream, folder, catalog_url).check()
    except Divergence as divergence:
        _diverged(name, stream)
        _tally(name, packed, diverged=True)
        raise AssertionError(f"{divergence} (both engines' files: {folder})") from None
    _tally(name, packed, diverged=False)
    shutil.rmtree(folder, ignore_errors=True)  # a diverging stream's files are kept


def _tally(name: str, streams: int, *, diverged: bool) -> None:
    """With ``DIFF_SAVE``, one line per query in ``runs.txt`` (a long run's figures survive
    an interrupted session)."""
    if SAVE:
        Path(SAVE).mkdir(parents=True, exist_ok=True)
        with (Path(SAVE) / "runs.txt").open("a") as runs:
            runs.write(f"{name} {streams} {'diverged' if diverged else 'same'}\n")


def _diverged(name: str, stream: Stream) -> None:
    _DIVERGED[name] += 1
    if SAVE:
        Path(SAVE).mkdir(parents=True, exist_ok=True)
        (Path(SAVE) / f"{name}-{os.getpid()}-{next(_IDS)}.json").write_text(
            json.dumps({"operator": name, "stream": json.loads(stream.to_json())})
        )


def _examples(operator: str) -> int:
    """Queries to run for ``DIFF_STREAMS`` streams (default 20) of ``operator``: each query
    carries the operator's ``pack`` streams."""
    pack = OPERATORS[operator].pack
    return -(-int(STREAMS or 20) // pack)


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}


def _given(name: str) -> Any:
    """The operator's examples: ``pack`` generated streams per query."""
    return lambda test: settings(max_examples=_examples(name), **SETTINGS)(  # type: ignore[arg-type]
        given(stream=packed(OPERATORS[name].pack))(test)
    )


@_given("running_aggregation")
def test_running_aggregation_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "running_aggregation", stream, OPERATORS["running_aggregation"].pack)


@_given("windowed_aggregation")
def test_windowed_aggregation_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "windowed_aggregation", stream, PACK)


@_given("session_windows")
def test_session_windows_equal_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "session_windows", stream, PACK)


@_given("event_time_timeouts")
def test_event_time_timeouts_equal_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "event_time_timeouts", stream, PACK)


@_given("drop_duplicates")
def test_drop_duplicates_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "drop_duplicates", stream, PACK)


@_given("drop_duplicates_within_watermark")
def test_drop_duplicates_within_watermark_equals_sparks(
    spark: SparkSession, catalog_url: str, stream: Stream
) -> None:
    _check(spark, catalog_url, "drop_duplicates_within_watermark", stream, PACK)


RESTARTED = ["windowed_aggregation", "session_windows", "event_time_timeouts", "drop_duplicates"]


@st.composite
def _restarted(draw: st.DrawFn) -> list[tuple[str, Stream]]:
    """One packed stream per operator in :data:`RESTARTED`, each with a restart."""
    cases = []
    for name in RESTARTED:
        stream = draw(packed(PACK).filter(lambda s: len(s.batches) > 1))
        restart = draw(st.integers(1, len(stream.batches) - 1))
        cases.append((name, replace(stream, restart_at=restart)))
    return cases


@settings(max_examples=int(os.environ.get("DIFF_RESTARTS", "2")), **SETTINGS)  # type: ignore[arg-type]
@given(cases=_restarted())
def test_a_restart_in_a_new_driver_process_gives_sparks_output(
    spark: SparkSession, catalog_url: str, cases: list[tuple[str, Stream]]
) -> None:
    """Each stream stops at a random batch; a new driver process (a subprocess with a Spark
    session of its own) resumes our side from the checkpoint root and the catalog, and Spark
    restarts from its checkpoint: every batch's output is still Spark's."""
    outcomes, jobs = [], []
    for name, stream in cases:
        folder = Path(tempfile.mkdtemp(prefix=f"diff-restart-{name}-"))
        assert stream.restart_at is not None
        outcome = run_stream(
            spark, OPERATORS[name], stream, folder, catalog_url, ours_until=stream.restart_at
        )
        outcomes.append(outcome)
        jobs.append(Resume(name, stream, folder, catalog_url, stream.restart_at))
    started = time.perf_counter()
    resumed = resume_elsewhere(jobs)
    TIMES["resume"] += time.perf_counter() - started
    for (name, stream), outcome, rows, job in zip(cases, outcomes, resumed, jobs, strict=True):
        assert sorted(rows) == list(range(stream.restart_at or 0, len(stream.batches)))
        outcome.ours.update(rows)
        label = f"{name} (new driver)"
        _RUN[label] += PACK
        _QUERIES[label] += 1
        try:
            outcome.check()
        except Divergence as divergence:
            _diverged(label, stream)
            raise AssertionError(f"{divergence} (both engines' files: {job.folder})") from None
        shutil.rmtree(job.folder, ignore_errors=True)


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


BRIDGE = Stream(
    batches=[
        [(0, "a", T0, 1), (0, "a", T0 + 8000, 2)],
        [(0, "a", T0 + 4000, 3)],
        [(0, "b", T0 + 40_000, 4)],
        [(0, "a", T0 + 1000, 5), (0, "a", T0 + 2000, 6)],
    ],
    zone="Asia/Kolkata",
    delay_s=2,
    size_s=5,
    slide_s=5,
    mode="append",
    restart_at=2,
)
"""Session windows: ``a``'s sessions [0, 5) and [8, 13) (s after ``T0``); a row at 4 s, not
late, merges them into [0, 13); a jump to 40 s; then a row at 1 s is late (its session ends at
6 s, the watermark) and one at 2 s is not: it joins the stored [0, 13), which closes in the
same batch with 4 rows."""


def test_a_late_row_merges_two_sessions_as_sparks(spark: SparkSession, catalog_url: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="diff-bridge-"))
    outcome = run_stream(spark, OPERATORS["session_windows"], BRIDGE, folder, catalog_url)
    outcome.check()
    shutil.rmtree(folder, ignore_errors=True)
    [(_part, user, start, end, n, *_)] = outcome.ours[3]
    assert (user, n, (end - start).total_seconds()) == ("a", 4, 13)
