"""Event-time rules without Spark: window assignment, lateness, the watermark's record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import drop_duplicates, map_groups_with_state, transform_with_state
from state_runtime.runtime.event_time import late_columns
from state_runtime.runtime.groups import GroupState, TimeoutKind
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.watermark import Watermark, drop_late, max_event_ms
from state_runtime.runtime.windows import Window

from .reference import WatermarkReference, window_starts
from .tws_processors import KEY, FraudDetector

US = 1_000_000


@settings(max_examples=300, deadline=None)
@given(
    times=st.lists(st.integers(-(10**12), 10**12) | st.integers(-50, 50), min_size=1, max_size=20),
    size_s=st.integers(1, 20),
    slide_div=st.integers(1, 5),
    offset_frac=st.integers(0, 4),
)
def test_window_assignment_is_sparks(
    times: list[int], size_s: int, slide_div: int, offset_frac: int
) -> None:
    size = size_s * US
    slide = max(size // slide_div, 1)
    offset = slide * offset_frac // 5
    window = Window(
        timedelta(microseconds=size), timedelta(microseconds=slide), timedelta(microseconds=offset)
    )
    rows, starts = window.starts(np.array(times, dtype=np.int64))
    got = sorted(zip(rows.tolist(), starts.tolist(), strict=True))
    want = sorted(
        (i, s) for i, t in enumerate(times) for s in window_starts(t, size, slide, offset)
    )
    assert got == want


def test_tumbling_windows_and_nulls() -> None:
    window = Window(timedelta(seconds=10))
    micros = np.array([0, 9_999_999, 10_000_000, -1, np.iinfo(np.int64).min], dtype=np.int64)
    rows, starts = window.starts(micros)
    assert rows.tolist() == [0, 1, 2, 3]  # the null time (INT64 minimum) has no window
    assert starts.tolist() == [0, 0, 10 * US, -10 * US]


def test_window_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="size"):
        Window(timedelta(0))
    with pytest.raises(InvalidArgument, match="slide"):
        Window(timedelta(seconds=5), timedelta(seconds=6))
    with pytest.raises(InvalidArgument, match="offset"):
        Window(timedelta(seconds=5), offset=timedelta(seconds=5))


def test_watermark_advances_as_spark() -> None:
    mark, ref = Watermark("ts", timedelta(seconds=5)), WatermarkReference(5000)
    current = 0
    for batch in ([12_000_000, 3_000_000], [], [9_000_000], [30_500_999]):
        current = mark.advance(current, max(batch) // 1000 if batch else None)
        ref.after_batch(batch)
        assert current == ref.current_ms
    assert current == 25_500
    with pytest.raises(InvalidArgument):
        Watermark("ts", timedelta(seconds=-1))


def test_rows_at_or_before_the_watermark_are_late() -> None:
    ts = pa.array([999_999, 1_000_000, 1_000_001, None], type=pa.timestamp("us", tz="UTC"))
    rows = pa.table({"ts": ts, "n": [1, 2, 3, 4]})
    kept, dropped = drop_late(rows, "ts", 1000)
    # A null event time is not late: Spark's ``ts <= watermark`` is null, the filter keeps it.
    assert kept.column("n").to_pylist() == [3, 4] and dropped == 2
    assert max_event_ms(rows, "ts") == 1000
    assert max_event_ms(rows.slice(0, 0), "ts") is None
    with pytest.raises(InvalidArgument, match="timestamp"):
        drop_late(pa.table({"ts": [1]}), "ts", 0)
    with pytest.raises(InvalidArgument, match="not in the input"):
        drop_late(rows, "other", 0)


def test_timeout_timestamp_rules() -> None:
    state = GroupState(None, 0, False, timeout="event_time", watermark_ms=5000)
    state.set_timeout_timestamp(datetime(1970, 1, 1, 0, 0, 6, tzinfo=UTC))
    assert state.timeout_at_ms == 6000
    with pytest.raises(InvalidArgument, match="earlier than the current watermark"):
        state.set_timeout_timestamp(4999)
    with pytest.raises(InvalidArgument, match="processing_time"):
        state.set_timeout_duration(10)
    with pytest.raises(InvalidArgument, match="event_time"):
        GroupState(None, 0, False).set_timeout_timestamp(10)


def _groups(op_id: int, timeout: TimeoutKind, column: str | None = None) -> StatefulOperator:
    return map_groups_with_state(
        op_id, ["part", "user"], KEY, "n bigint", "part int, user string, ts timestamp",
        lambda key, rows, state: [], 2, timeout=timeout, event_time_column=column,
    )  # fmt: skip


def _tws(op_id: int, time_mode: str) -> StatefulOperator:
    schema = FraudDetector.SCHEMA
    return transform_with_state(
        op_id, ["part", "user"], KEY, FraudDetector(), schema, 2, time_mode=time_mode
    )


def test_event_time_operators_drop_rows_late_on_the_watermarked_column() -> None:
    """Spark's event-time timeouts and timers (``EventTimeTimeout``, ``EventTime``) drop late
    rows on their input's watermarked column with no column named; other modes keep them; an
    ``event_time_column`` is judged instead; a function's output carries no watermark on, a
    deduplication's rows do."""
    mark = Watermark("ts", timedelta(0))
    dedup = drop_duplicates(0, ["part", "user", "ts"], "part int, user string, ts timestamp",
                            mark, 2)  # fmt: skip
    cases: list[tuple[list[StatefulOperator], tuple[str | None, ...]]] = [
        ([_tws(0, "EventTime")], ("ts",)),
        ([_tws(0, "None")], (None,)),
        ([_groups(0, "event_time")], ("ts",)),
        ([_groups(0, "processing_time")], (None,)),
        ([_groups(0, "event_time", "other")], ("other",)),
        ([_groups(0, "processing_time", "other")], ("other",)),
        ([dedup, _tws(1, "EventTime")], ("ts", "ts")),
        ([_groups(0, "event_time"), _tws(1, "EventTime")], ("ts", None)),
    ]
    for operators, want in cases:
        assert late_columns(operators, mark) == want
    assert late_columns([_groups(0, "processing_time")], None) == (None,)
