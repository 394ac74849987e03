"""Session windows batch by batch on a real store, without Spark (the comparison with Spark's
engine is in test_differential_vs_spark.py): sessions merge across batches, a late row that
is not dropped bridges two sessions, late rows go by their session's end, closed sessions are
emitted once and leave the state; per-row gaps as Spark casts them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import Agg, SessionWindow, session_window_aggregation
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.storage import open_storage
from state_runtime.store.config import StoreConfig
from state_runtime.store.provider import StateStoreProvider

S = 1_000_000
AGGS = [Agg("n", "count"), Agg("total", "sum", "amount"), Agg("low", "min", "user", "string")]


class Sessions:
    """One partition of a session window operator, one committed version per batch."""

    def __init__(self, tmp_path: Path, gap: timedelta | str) -> None:
        self.op = session_window_aggregation(
            0, ["user"], "user string", "ts", SessionWindow(gap), AGGS, 1
        )
        self.provider = StateStoreProvider(
            open_storage(str(tmp_path)), 0, 0, "default",
            key_schema=self.op.schema.key, value_schema=self.op.schema.value,
            config=StoreConfig(),
        )  # fmt: skip
        self.version = 0
        self.context: BatchContext | None = None

    def batch(
        self, rows: list[tuple[Any, ...]], watermark_s: int, late_s: int, zone: str = "UTC"
    ) -> list[tuple[Any, ...]]:
        """Run a batch of ``(user, ts seconds, amount[, gap])``; its output as
        ``(user, start s, end s, n, total, low)``."""
        columns: dict[str, pa.Array] = {
            "user": pa.array([r[0] for r in rows], pa.string()),
            "ts": pa.array(
                [None if r[1] is None else int(r[1] * S) for r in rows],
                pa.timestamp("us", tz="UTC"),
            ),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
        }
        if rows and len(rows[0]) == 4:
            columns["gap"] = pa.array([r[3] for r in rows], pa.string())
        store = self.provider.get_store(self.version)
        self.context = BatchContext(
            "q", self.version, 0, 0, watermark_s * 1000, late_s * 1000, zone
        )
        with batch_scope(self.context):
            out = self.op.update(store, pa.table(columns))
        store.commit()
        self.version += 1
        assert out is None or isinstance(out, pa.Table)
        return sorted(
            (
                r["user"],
                r["session_window"]["start"].timestamp(),
                r["session_window"]["end"].timestamp(),
                r["n"],
                r["total"],
                r["low"],
            )
            for r in ([] if out is None else out.to_pylist())
        )

    def state(self) -> dict[str, list[tuple[float, float, int]]]:
        store = self.provider.get_read_store(self.version)
        return {
            key[0]: [(start.timestamp(), end.timestamp(), n) for start, end, n, *_ in value[0]]
            for key, value in store.items()
        }


def test_sessions_merge_across_batches_and_close_once(tmp_path: Path) -> None:
    sessions = Sessions(tmp_path, timedelta(seconds=5))
    assert sessions.batch([], 0, 0) == []  # an empty first batch on an empty store
    assert sessions.batch([("a", 0, 1), ("a", 8, 2), (None, None, 3), ("b", 5, 4)], 0, 0) == []
    assert sessions.state() == {"a": [(0, 5, 1), (8, 13, 1)], "b": [(5, 10, 1)]}
    # a row at 4 s (its session [4, 9) ends after the watermark: not late) bridges both
    assert sessions.batch([("a", 4, 3)], 6, 0) == []
    assert sessions.state() == {"a": [(0, 13, 3)], "b": [(5, 10, 1)]}
    # b's [5, 10) closes at watermark 10 (end <= watermark), a's does not
    assert sessions.batch([], 10, 6) == [("b", 5, 10, 1, 4, "b")]
    # at 1 s: [1, 6) ends at the previous watermark 10: late. At 6 s: [6, 11) is not late,
    # joins a's stored [0, 13), which then closes in the same batch with 4 rows
    out = sessions.batch([("a", 1, 5), ("a", 6, 6), ("c", 40, 7)], 38, 10)
    assert out == [("a", 0, 13, 4, 12, "a")]
    assert sessions.context is not None and sessions.context.event_time.late_rows == 1
    assert sessions.state() == {"c": [(40, 45, 1)]}


def test_touching_sessions_merge(tmp_path: Path) -> None:
    sessions = Sessions(tmp_path, timedelta(seconds=5))
    sessions.batch([("a", 0, 1), ("a", 5, 1), ("a", 11, 1)], 0, 0)
    assert sessions.state() == {"a": [(0, 10, 2), (11, 16, 1)]}  # 5 <= 5 merges, 11 > 10 not


def test_per_row_gaps_as_spark_casts_them(tmp_path: Path) -> None:
    sessions = Sessions(tmp_path, "gap")
    rows = [
        ("a", 0, 1, "2 seconds"),
        ("a", 10, 2, "interval 1 minute 0.5 seconds"),
        ("b", 0, 3, None),  # null gap: no session
        ("b", 1, 4, "0 seconds"),  # not positive: no session
        ("b", 2, 5, "soon"),  # not an interval: null, no session
        ("c", 0, 6, "-1 second"),
        ("d", 86_400 * 19_792, 7, "1 day"),  # 2024-03-09 16:00 in Los Angeles: a calendar day
    ]
    sessions.batch(rows, 0, 0, zone="America/Los_Angeles")
    day = datetime(2024, 3, 10, tzinfo=UTC).timestamp()
    assert sessions.state() == {
        "a": [(0, 2, 1), (10, 70.5, 1)],
        "d": [(day, day + 86_400 - 3600, 1)],  # across the DST change: 23 hours
    }
    with pytest.raises(InvalidArgument, match="months and years are not supported"):
        sessions.batch([("e", 0, 1, "1 month")], 0, 0)
