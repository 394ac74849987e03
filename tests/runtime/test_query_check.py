"""A wrong query is refused on the driver, before any Spark job and before the catalog knows
its stores, with a typed error naming the column, the operator and the rule; the append-mode
rule is checked against Spark's own streaming planner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.catalog import Catalog
from state_runtime.errors import QueryRefused
from state_runtime.runtime import (
    Agg,
    SessionWindow,
    StatefulOperator,
    StatefulQuery,
    Watermark,
    Window,
    drop_duplicates,
    map_groups_with_state,
    running_aggregation,
    session_window_aggregation,
    windowed_aggregation,
)
from state_runtime.runtime.query_check import check_query

pytestmark = pytest.mark.spark

INPUT = "user string, ts timestamp, other timestamp, label string, flag boolean, amount bigint"
ROW = ("u", datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC), "x", True, 1)


def _windows(
    column: str, mode: str = "append", aggs: Sequence[Agg] = (), operator_id: int = 0
) -> StatefulOperator:
    return windowed_aggregation(
        operator_id, ["user"], "user string", column, Window(timedelta(seconds=10)),
        [Agg("n", "count"), *aggs], 2, output_mode=mode,  # type: ignore[arg-type]
    )  # fmt: skip


def _sessions(column: str, gap: timedelta | str = timedelta(seconds=5)) -> StatefulOperator:
    return session_window_aggregation(
        0, ["user"], "user string", column, SessionWindow(gap), [Agg("n", "count")], 2
    )


def _groups(event_time_column: str) -> StatefulOperator:
    return map_groups_with_state(
        0, ["user"], "user string", "n bigint", "user string, n bigint",
        lambda key, rows, state: None, 2,
        timeout="event_time", event_time_column=event_time_column,
    )  # fmt: skip


def _passes_rows(key: str, row: Any, state: Any) -> Any:
    return None


def _rows_out() -> StatefulOperator:
    """A map_groups_with_state whose function outputs a ``ts`` of its own (Spark: a new
    attribute, which no watermark marks)."""
    return map_groups_with_state(
        0, ["user"], "user string", "n bigint", "user string, ts timestamp", _passes_rows, 2
    )


CASES: list[tuple[str, Callable[[], list[StatefulOperator]], str | None, str]] = [
    ("missing watermark column", lambda: [_windows("ts")], "nope",
     r"the query's watermark: event-time column 'nope' is not in its input"),
    ("string watermark column", lambda: [_windows("ts")], "label",
     r"event-time column 'label' is string, not a timestamp"),
    ("append windows off the watermark", lambda: [_windows("other")], "ts",
     r"windowed aggregation \(operator 0\): windows over column 'other', but the watermark is "
     r"on 'ts' in append mode \(rule: Spark refuses an append-mode aggregation"),
    ("append windows over a function's output of the watermark's name",
     lambda: [_rows_out(), _windows("ts", operator_id=1)], "ts",
     r"windowed aggregation \(operator 1\): windows over column 'ts', which carries no "
     r"watermark here: .* in append mode \(rule: Spark refuses"),
    ("update windows off the watermark", lambda: [_windows("other", "update")], "ts",
     r"must be over the watermark's column"),
    ("string window column", lambda: [_windows("label", "update")], "ts",
     r"window time column 'label' is string, not a timestamp"),
    ("sum of a boolean", lambda: [_windows("ts", "update", [Agg("s", "sum", "flag")])], "ts",
     r"aggregate 's' \(sum\) column 'flag' is boolean, not a numeric"),
    ("sessions off the watermark", lambda: [_sessions("other")], "ts",
     r"session window aggregation \(operator 0\): windows over column 'other', but the "
     r"watermark is on 'ts' in append mode"),
    ("numeric session gap column", lambda: [_sessions("ts", "amount")], "ts",
     r"session gap column 'amount' is bigint, not a string"),
    ("missing session gap column", lambda: [_sessions("ts", "gap")], "ts",
     r"session gap column 'gap' is not in its input"),
    ("missing key", lambda: [running_aggregation(0, ["who"], "who string",
                                                 [Agg("n", "count")], 2)], None,
     r"running aggregation \(operator 0\): key column 'who' is not in its input"),
    ("string event_time_column", lambda: [_groups("label")], "ts",
     r"map_groups_with_state \(operator 0\): event_time_column 'label' is string"),
    ("chained: a column the first operator drops", lambda: [
        running_aggregation(0, ["user"], "user string", [Agg("n", "count")], 2),
        running_aggregation(1, ["user"], "user string", [Agg("t", "sum", "amount")], 2)], None,
     r"running aggregation \(operator 1\): aggregate 't' \(sum\) column 'amount' is not in its "
     r"input <struct<user:string,n:bigint>>"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "ops", "column", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_wrong_query_is_refused_on_the_driver_before_any_job(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    name: str,
    ops: Callable[[], list[StatefulOperator]],
    column: str | None,
    message: str,
) -> None:
    watermark = None if column is None else Watermark(column, timedelta(seconds=5))
    query = StatefulQuery(
        "refused", str(tmp_path / "ckpt"), ops(), catalog_url=sqlite_catalog_url,
        watermark=watermark,
    )  # fmt: skip
    df = spark.createDataFrame([ROW], INPUT)
    group = f"query-check-{tmp_path.name}"
    spark.sparkContext.setJobGroup(group, name)
    try:
        with pytest.raises(QueryRefused, match=message):
            query.run_batch(df, 0)
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []
    assert Catalog.open(sqlite_catalog_url).stores(query.root) == []


def _spark_query(session: SparkSession, inbox: Path, window_column: str, mode: str) -> Any:
    stream: DataFrame = (
        session.readStream.schema(INPUT)
        .json(str(inbox))
        .withWatermark("ts", "5 seconds")
        .groupBy("user", F.window(window_column, "10 seconds"))
        .count()
    )
    return stream.writeStream.outputMode(mode).format("noop").start()


def _spark_chain(session: SparkSession, inbox: Path, first: str) -> Any:
    """``first`` (a deduplication or a function of the groups that outputs ``ts``), then an
    append-mode aggregation over windows of ``ts``."""
    stream = session.readStream.schema(INPUT).json(str(inbox)).withWatermark("ts", "5 seconds")
    if first == "function":

        def rows(key: Any, frames: Any, state: Any) -> Any:
            for frame in frames:
                yield frame[["user", "ts"]]

        stream = stream.groupBy("user").applyInPandasWithState(
            rows, "user string, ts timestamp", "n long", "append", "NoTimeout"
        )
    else:
        stream = stream.dropDuplicatesWithinWatermark(["user"])
    counted = stream.groupBy("user", F.window("ts", "10 seconds")).count()
    return counted.writeStream.outputMode("append").format("noop").start()


def test_sparks_planner_agrees_on_append_mode_windows(spark: SparkSession, tmp_path: Path) -> None:
    """Spark refuses append-mode windows over a column other than the watermark's, and accepts
    them over the watermark's column: the rule our check applies. After another stateful
    operator, Spark's watermark marks the column still if a deduplication passed it on, and
    not if a function of the groups output it; so does our check (no job: it runs first)."""
    session = spark.newSession()
    inbox = tmp_path / "in"
    inbox.mkdir()
    refused = r"STREAMING_OUTPUT_MODE\.UNSUPPORTED_OPERATION.*append"
    with pytest.raises(AnalysisException, match=refused):
        _spark_query(session, inbox, "other", "append")
    _spark_query(session, inbox, "ts", "append").stop()
    with pytest.raises(AnalysisException, match=refused):
        _spark_chain(session, inbox, "function")
    _spark_chain(session, inbox, "deduplication").stop()

    schema = session.createDataFrame([ROW], INPUT).schema
    watermark = Watermark("ts", timedelta(seconds=5))
    with pytest.raises(QueryRefused, match=r"windows over column 'ts', which carries no"):
        check_query([_rows_out(), _windows("ts", operator_id=1)], watermark, schema)
    deduplicated = drop_duplicates(0, ["user"], INPUT, watermark, 2, within_watermark=True)
    check_query([deduplicated, _windows("ts", operator_id=1)], watermark, schema)


def test_session_windows_in_update_mode_are_refused_as_by_sparks_planner(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's planner refuses update mode for session windows and accepts append mode; the
    operator is refused on the driver, when it is built, with the rule."""
    with pytest.raises(QueryRefused, match=r"output mode 'update' \(rule: Spark supports only"):
        session_window_aggregation(
            0, ["user"], "user string", "ts", SessionWindow(timedelta(seconds=5)),
            [Agg("n", "count")], 2, output_mode="update",
        )  # fmt: skip
    session = spark.newSession()
    inbox = tmp_path / "in"
    inbox.mkdir()

    def start(mode: str) -> Any:
        stream = (
            session.readStream.schema(INPUT)
            .json(str(inbox))
            .withWatermark("ts", "5 seconds")
            .groupBy("user", F.session_window("ts", "5 seconds"))
            .count()
        )
        return stream.writeStream.outputMode(mode).format("noop").start()

    with pytest.raises(AnalysisException, match=r"UNSUPPORTED_OPERATION.*session window"):
        start("update")
    start("append").stop()
