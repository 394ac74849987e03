"""Event time: the watermark of a query and the rows it makes late.

As in Spark: the watermark of batch ``b`` is ``max(watermark of b - 1, the largest event time
seen in batches 0..b-1 minus the delay)``, starting at 0 (the epoch). The driver fixes it
before the batch runs and records it in the catalog, so a replayed batch or a restarted query
uses exactly the value the original batch used; the tasks report the largest event time they
saw, recorded with the batch for the next one. As in Spark since 3.4 (the watermark
propagation of SPARK-40925 / SPARK-42376), batch ``b`` evicts state with its own watermark but
judges input rows late against batch ``b - 1``'s: a row is late when its event time is at or
before that one. Late rows are dropped before the stateful stage and counted.
Times are microseconds (Spark's timestamp unit) inside a batch, milliseconds in the catalog;
:mod:`state_runtime.runtime.times` owns the conversions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import pyarrow as pa

from state_runtime.errors import InvalidArgument
from state_runtime.runtime.times import MICROS_PER_MS, duration_ms, event_micros, null_times


@dataclass(frozen=True)
class Watermark:
    """``Watermark("ts", timedelta(minutes=10))``: Spark's ``withWatermark("ts", "10 minutes")``.

    ``column`` is a timestamp column of the query's input (the first operator's input)."""

    column: str
    delay: timedelta

    def __post_init__(self) -> None:
        if not self.column:
            raise InvalidArgument("a watermark needs an event-time column")
        if self.delay < timedelta(0):
            raise InvalidArgument(f"watermark delay must not be negative, got {self.delay}")

    @property
    def delay_ms(self) -> int:
        return duration_ms(self.delay)

    def advance(self, watermark_ms: int, max_event_ms: int | None) -> int:
        """The next batch's watermark after a batch that saw ``max_event_ms`` (None: no rows)."""
        if max_event_ms is None:
            return watermark_ms
        return max(watermark_ms, max_event_ms - self.delay_ms)


@dataclass(frozen=True)
class BatchWatermarks:
    """The two watermarks a batch uses (ms): its own, for eviction and timeouts, and the
    previous batch's, for late rows."""

    eviction_ms: int
    late_rows_ms: int


@dataclass
class EventTimeStats:
    """What one task's event-time work did, reported with its checkpoint info."""

    late_rows: int = 0
    evicted: int = 0
    evict_ms: float = 0.0


def max_event_ms(rows: pa.Table, column: str) -> int | None:
    """The largest event time of ``rows`` in milliseconds (floored, as Spark), or None."""
    if column not in rows.column_names:
        raise InvalidArgument(
            f"event-time column {column!r} is not in the input: {rows.column_names}"
        )
    values = rows.column(column)
    if values.null_count == len(values):
        return None
    return int(event_micros(values, column).max() // MICROS_PER_MS)


def is_late(micros: np.ndarray, watermark_ms: int) -> np.ndarray:
    """Which event times (microseconds) are at or before the watermark: Spark's rule. A null
    time (:func:`null_times`) is not late: Spark's predicate ``eventTime <= watermark`` is
    null for it, and the filter keeps it."""
    late: np.ndarray = (micros <= watermark_ms * MICROS_PER_MS) & ~null_times(micros)
    return late


def drop_late(rows: pa.Table, column: str, watermark_ms: int) -> tuple[pa.Table, int]:
    """``rows`` without the late ones (rows with a null event time stay), and how many went."""
    if column not in rows.column_names:
        raise InvalidArgument(
            f"event-time column {column!r} is not in the input: {rows.column_names}"
        )
    late = is_late(event_micros(rows.column(column), column), watermark_ms)
    dropped = int(np.count_nonzero(late))
    return (rows.filter(pa.array(~late)) if dropped else rows), dropped
