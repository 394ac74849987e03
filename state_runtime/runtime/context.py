"""The batch a task is working on, for update functions that need it (timeouts, logging)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from state_runtime.runtime.watermark import EventTimeStats

if TYPE_CHECKING:
    from state_runtime.store.state_store import StateStore


@dataclass(frozen=True)
class BatchContext:
    query_id: str
    batch_id: int
    batch_time_ms: int
    """The driver's clock when the batch started: the same for every task of the batch."""
    partition_id: int
    watermark_ms: int | None = None
    """The batch's event-time watermark (ms), fixed by the driver, for eviction and timeouts;
    None without a watermark."""
    late_rows_watermark_ms: int | None = None
    """The previous batch's watermark (ms): input rows at or before it are late (Spark)."""
    time_zone: str = "UTC"
    """The Spark session's time zone: naive datetimes are wall-clock times there."""
    event_time: EventTimeStats = field(default_factory=EventTimeStats)
    """Late rows dropped and state evicted by event time in this task, for the metrics."""
    stores: Mapping[str, StateStore] = field(default_factory=dict)
    """Every store of the operator for this partition, by store name (the main one too)."""


_current: ContextVar[BatchContext | None] = ContextVar("state_runtime_batch", default=None)


@contextmanager
def batch_scope(batch: BatchContext) -> Iterator[BatchContext]:
    """Make ``batch`` the one :func:`current_batch` returns for the duration of the block (the
    task runs its update function in one; a driver of the operator without Spark does too)."""
    token = _current.set(batch)
    try:
        yield batch
    finally:
        _current.reset(token)


def current_batch() -> BatchContext:
    """The batch being processed; only valid inside an update function."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("current_batch() is only available inside a stateful update function")
    return ctx
