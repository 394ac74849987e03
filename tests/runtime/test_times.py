"""Time conversions in integers: the float drift of the old arithmetic reproduced, naive
datetimes read in the session time zone, checked against Spark's own conversion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import GroupState
from state_runtime.runtime.times import (
    datetime_micros,
    datetime_ms,
    duration_ms,
    event_micros,
    interval,
    null_times,
    plus_days,
    time_zone,
)
from state_runtime.runtime.watermark import Watermark, drop_late

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# 2004-03-01T00:00:00.021Z: ``timestamp() * 1000`` is 1078099200020.9998 in floating point.
DRIFTING = datetime(2004, 3, 1, 0, 0, 0, 21_000, tzinfo=UTC)
DRIFTING_MS = 1_078_099_200_021
ZONES = ["UTC", "America/Los_Angeles", "Europe/Paris", "Asia/Kolkata", "+05:45", "-03:00"]


def test_the_float_arithmetic_drifted_and_the_integer_one_does_not() -> None:
    assert int(DRIFTING.timestamp() * 1000) == DRIFTING_MS - 1  # the old defect
    assert datetime_ms(DRIFTING, "UTC") == DRIFTING_MS
    assert int(timedelta(milliseconds=1001).total_seconds() * 1000) == 1000  # the old defect
    assert duration_ms(timedelta(milliseconds=1001)) == 1001
    assert duration_ms(timedelta(microseconds=1999)) == 1  # floored, as Spark
    assert datetime_ms(EPOCH - timedelta(microseconds=1), "UTC") == -1  # floorDiv


def test_a_timeout_at_exactly_the_watermark_as_a_datetime_is_accepted() -> None:
    state = GroupState((1,), 0, False, timeout="event_time", watermark_ms=DRIFTING_MS)
    state.set_timeout_timestamp(DRIFTING)  # refused before: "earlier than the watermark"
    assert state.timeout_at_ms == DRIFTING_MS
    with pytest.raises(InvalidArgument, match="earlier than the current watermark"):
        state.set_timeout_timestamp(DRIFTING - timedelta(milliseconds=1))


def test_timeout_durations_are_exact_milliseconds() -> None:
    state = GroupState((1,), 5_000, False)
    state.set_timeout_duration(timedelta(milliseconds=1001))
    assert state.timeout_at_ms == 6_001
    with pytest.raises(InvalidArgument, match="positive"):
        state.set_timeout_duration(timedelta(microseconds=999))
    assert Watermark("ts", timedelta(milliseconds=1003)).delay_ms == 1003


def test_naive_datetimes_are_read_in_the_session_time_zone() -> None:
    naive = datetime(2024, 1, 1)
    state = GroupState(None, 0, False, timeout="event_time", time_zone="America/Los_Angeles")
    state.set_timeout_timestamp(naive)
    assert state.timeout_at_ms == datetime_ms(datetime(2024, 1, 1, 8, tzinfo=UTC), "UTC")
    aware = datetime(2024, 1, 1, tzinfo=UTC)
    state.set_timeout_timestamp(aware)  # an aware datetime is its own instant, whatever zone
    assert state.timeout_at_ms == datetime_ms(aware, "Asia/Kolkata")
    with pytest.raises(InvalidArgument, match="unknown time zone 'Mars/Olympus'"):
        time_zone("Mars/Olympus")


def test_null_event_times_are_never_late() -> None:
    for unit in ("s", "ms", "us", "ns"):
        column = pa.array([None, 0, 5], type=pa.timestamp(unit, tz="UTC"))
        assert null_times(event_micros(column, "ts")).tolist() == [True, False, False]
    rows = pa.table({"ts": pa.array([None, 1_000_000, 3_000_000], pa.timestamp("us"))})
    kept, dropped = drop_late(rows, "ts", 1000)
    assert dropped == 1 and kept.column("ts").to_pylist()[0] is None


naive_times = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1))


@pytest.mark.spark
@settings(max_examples=5, deadline=None)
@given(st.lists(naive_times, min_size=20, max_size=60), st.sampled_from(ZONES))
def test_naive_datetimes_convert_as_sparks_session_time_zone(
    spark: SparkSession, values: list[datetime], zone: str
) -> None:
    # DST gaps and overlaps included: the hour after 2024-03-10 02:00 in Los Angeles, etc.
    values += [datetime(2024, 3, 10, 2, 30), datetime(2024, 11, 3, 1, 30), datetime(2004, 3, 1)]
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", zone)
    text = [v.isoformat(sep=" ") for v in values]
    rows = (
        session.createDataFrame([(i, t) for i, t in enumerate(text)], "i int, t string")
        .selectExpr("i", "unix_micros(to_timestamp(t)) AS micros")
        .collect()
    )
    theirs = {r.i: r.micros for r in rows}
    assert [datetime_micros(v, zone) for v in values] == [theirs[i] for i in range(len(values))]


GAPS = [
    "5 seconds", "1 second", "interval 1 minute 0.5 seconds", "2 hours 3 minutes", "1.25 seconds",
    "1 day", "2 days 1 hour", "1 week", "10 milliseconds", "7 microseconds", "-5 seconds",
]  # fmt: skip


def test_interval_strings_parse_as_spark_casts_them() -> None:
    assert interval("interval 1 minute 0.5 seconds") == (0, 60_500_000)
    assert interval("2 DAYS 1 hour") == (2, 3_600_000_000)
    assert interval("-5 seconds") == (0, -5_000_000)
    assert interval("five seconds") is None and interval("5") is None and interval("") is None
    with pytest.raises(InvalidArgument, match="months and years are not supported"):
        interval("1 month")


@pytest.mark.spark
@settings(max_examples=4, deadline=None)
@given(st.lists(naive_times, min_size=10, max_size=30), st.sampled_from(ZONES))
def test_session_gaps_add_as_sparks_timestamp_plus_interval(
    spark: SparkSession, values: list[datetime], zone: str
) -> None:
    """A gap string added to a time, days in the session zone (DST included), as Spark's
    ``timestamp + CAST(gap AS INTERVAL)``."""
    values += [datetime(2024, 3, 9, 2, 30), datetime(2024, 11, 2, 1, 30), datetime(2024, 3, 30, 2)]
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", zone)
    cases = [(v.isoformat(sep=" "), gap) for v in values for gap in GAPS]
    rows = (
        session.createDataFrame(
            [(i, t, g) for i, (t, g) in enumerate(cases)], "i int, t string, g string"
        )
        .selectExpr(
            "i",
            "unix_micros(to_timestamp(t)) AS start",
            "unix_micros(to_timestamp(t) + CAST(g AS INTERVAL)) AS end",
        )
        .collect()
    )
    for row in rows:
        days, micros = interval(cases[row.i][1]) or (0, 0)
        ours = (plus_days(row.start, days, zone) if days else row.start) + micros
        assert ours == row.end, (cases[row.i], zone)
