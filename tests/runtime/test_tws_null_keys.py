"""The documented differences of ``transform_with_state`` from Spark's
``transformWithStateInPandas`` on null keys (docs/transform-with-state.md, Equal to Spark),
pinned: each test asserts the exact difference, so it fails if either engine changes.

Spark's pandas worker sets the implicit grouping key of a null string key from the pandas
frame's float ``nan``; the JVM stores that key's state and timers under the string ``"NaN"``,
so a timer of a null key fires with the key ``"NaN"`` and a real ``"NaN"`` key shares the
null key's state. Ours keeps a null key null (a merge of two distinct keys' state is not
copied). A null timestamp key fails Spark's pandas form; ours hands it ``NaT`` and runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from state_runtime.runtime import read_state

from .differential import (
    Outcome,
    Rows,
    Stream,
    next_batch,
    run_stream,
)
from .tws_processors import (
    FraudDetector,
    KeyEcho,
    Totals,
    spark_null_key_as_ours,
    time_key_operator,
    tws_operator,
)

pytestmark = pytest.mark.spark

T = 1_700_000_000_000


def test_a_null_keys_timer_fires_in_spark_with_the_key_nan(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Found by ``make fuzz-tws`` (``FraudDetector``, hypothesis seed 4): both open a window
    for the null key and fire its timer; Spark's alert has ``user`` ``"NaN"``, ours null;
    every other row is equal."""
    stream = Stream(
        [[(0, "a", T + 10_000, 0)], [(0, "a", T + 10_000, 0), (0, None, T + 5_000, 8)]],
        "UTC", 0, 4, 4, "update", None,
    )  # fmt: skip
    outcome = run_stream(
        spark, tws_operator("FraudDetector", FraudDetector, "EventTime"), stream, tmp_path,
        sqlite_catalog_url,
    )  # fmt: skip
    opened = (0, None, "open", T + 5_000, 8)
    assert outcome.ours == {0: [], 1: [(0, None, "alert", T + 8_000, 8), opened]}
    assert outcome.theirs == {0: [], 1: [(0, "NaN", "alert", T + 8_000, 8), opened]}
    assert {b: spark_null_key_as_ours(rows) for b, rows in outcome.theirs.items()} == outcome.ours


def _totals(rows: Rows) -> list[tuple[tuple[Any, ...], Any]]:
    return sorted((((r[0], r[1]), r[2]) for r in rows), key=repr)


def _a_shared_partition(spark: SparkSession) -> int:
    """A ``part`` whose keys ``(part, null)`` and ``(part, "NaN")`` hash to the same of the
    harness's 2 shuffle partitions (Spark's ``hash``, the Murmur3 of its hash partitioning)."""
    return next(
        p
        for p in range(16)
        if spark.sql(
            f"SELECT pmod(hash({p}, CAST(NULL AS STRING)), 2) = pmod(hash({p}, 'NaN'), 2)"
        ).first()[0]
    )


def test_a_null_key_and_a_nan_key_share_state_in_spark_not_in_ours(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """A null ``user`` then the string ``"NaN"`` in one partition (``Totals``, pandas form):
    Spark stores the null key's total under ``"NaN"`` (its state data source shows no null
    key) and the ``"NaN"`` key's batch reads it; ours keeps two keys. (In different
    partitions Spark keeps two totals both keyed ``"NaN"``, one in each.)"""
    p = _a_shared_partition(spark)
    stream = Stream(
        [[(p, None, T, 5)], [(p, "NaN", T, 3)]], "UTC", 0, 4, 4, "update", None
    )  # fmt: skip
    first = replace(stream, batches=stream.batches[:1])
    operator = tws_operator("Totals", Totals, "None")
    outcome = run_stream(spark, operator, first, tmp_path, sqlite_catalog_url)
    assert outcome.check() == 1
    assert outcome.ours[0] == [(p, None, 5, False)]

    def stored() -> list[tuple[tuple[Any, ...], Any]]:
        theirs = spark.read.format("statestore").option("path", str(tmp_path / "spark-ckpt"))
        rows = theirs.option("stateVarName", "total").load().collect()
        return [t for t in _totals([(*r.key, r.value[0]) for r in rows]) if t[0][0] == p]

    assert stored() == [((p, "NaN"), 5)]
    ours, theirs = next_batch(spark, operator, stream, tmp_path, sqlite_catalog_url, outcome, 1)
    ours()
    theirs()
    assert outcome.ours[1] == [(p, "NaN", 3, False)]
    assert outcome.theirs[1] == [(p, "NaN", 8, False)]
    assert stored() == [((p, "NaN"), 8)]
    ours = read_state(
        spark, str(tmp_path / "ckpt"), 0, catalog_url=sqlite_catalog_url, state_variable="total"
    ).collect()
    totals = _totals([(*r.key, r.value[0]) for r in ours])
    assert [t for t in totals if t[0][0] == p] == [((p, "NaN"), 3), ((p, None), 5)]


def test_a_null_int_keys_rows_reach_spark_one_call_each(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Three rows of the key ``(null, "a")`` (``part`` an int) in one batch (``KeyEcho``, one
    output row per call): Spark's worker regroups the frame's rows with ``itertools.groupby``
    and a ``nan`` is not equal to another, so each row is a call of its own; ours makes one
    call with the three."""
    stream = Stream([[(None, "a", T, a) for a in (1, 2, 3)]], "UTC", 0, 4, 4, "update", None)  # type: ignore[misc]
    outcome = run_stream(
        spark, tws_operator("KeyEcho", KeyEcho, "None"), stream, tmp_path, sqlite_catalog_url
    )
    assert outcome.ours == {0: [("'a'",)]}
    assert outcome.theirs == {0: [("'a'",)] * 3}


def test_a_null_timestamp_key_fails_sparks_pandas_form_and_runs_in_ours(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Rows of a null ``ts`` key and of a set one, keyed ``(part, ts)`` (``KeyCount``, pandas
    form): Spark's worker fails setting the null key from the frame's ``NaT`` (its implicit
    key is converted with ``timetuple``); ours hands ``NaT`` and counts the key's rows (its
    state across batches: test_tws_batching.py)."""
    stream = Stream(
        [[(0, "a", None, 1), (0, "b", T, 2), (0, "c", None, 3)]], "UTC", 0, 4, 4, "update", None
    )  # fmt: skip
    operator = time_key_operator()
    outcome = Outcome(operator, stream)
    ours, theirs = next_batch(spark, operator, stream, tmp_path, sqlite_catalog_url, outcome, 0)
    ours()
    assert outcome.ours == {0: [("Timestamp('2023-11-14 22:13:20')", 1), ("NaT", 2)]}
    with pytest.raises(Exception, match="NaTType does not support timetuple"):
        theirs()
    assert outcome.theirs == {}
