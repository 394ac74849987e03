"""``map_groups_with_state``: a user function per key with its state, timeouts and TTL.

As with Spark's ``mapGroupsWithState`` (and Spark Streaming's ``mapWithState``), the function
sees one key, that key's new rows in the batch and a :class:`GroupState`. A key may be given
a timeout; a key whose timeout has passed at a later batch gets one more call with no rows
and ``has_timed_out`` set, and is then removed unless the function updates it. ``ttl`` gives
every key a timeout renewed on each update. With ``timeout="event_time"`` the function sets
an event-time timestamp instead (``state.set_timeout_timestamp``), and the key times out once
the query's watermark passes it, on empty batches too. The stored state of the batch's keys is
read in one vectorised lookup; finding expired keys is one vectorised pass per sorted run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StructField, StructType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.context import BatchContext, current_batch
from state_runtime.runtime.operator import ColumnUse, StatefulOperator
from state_runtime.runtime.times import datetime_ms, duration_ms
from state_runtime.store.arrow_rows import struct_rows
from state_runtime.store.config import StoreConfig
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

TIMEOUT_FIELD = "__timeout_at_ms"

TimeoutKind = Literal["processing_time", "event_time"]

GroupFunction = Callable[
    [tuple[Any, ...], list[tuple[Any, ...]], "GroupState"], Iterable[tuple[Any, ...]] | None
]


class GroupState:
    """One key's state inside a ``map_groups_with_state`` call."""

    def __init__(
        self,
        value: tuple[Any, ...] | None,
        batch_time_ms: int,
        timed_out: bool,
        *,
        timeout: TimeoutKind = "processing_time",
        watermark_ms: int | None = None,
        time_zone: str = "UTC",
    ) -> None:
        self._value = value
        self._time_zone = time_zone
        self._timeout = timeout
        self.watermark_ms = watermark_ms
        """The batch's event-time watermark (ms), as Spark's ``getCurrentWatermarkMs``."""
        self._changed = False
        self._removed = False
        self.timeout_at_ms: int | None = None
        self.batch_time_ms = batch_time_ms
        self.has_timed_out = timed_out

    @property
    def exists(self) -> bool:
        return self._value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self._value

    def update(self, value: tuple[Any, ...]) -> None:
        self._value = value
        self._changed = True
        self._removed = False

    def remove(self) -> None:
        self._value = None
        self._removed = True

    def set_timeout_duration(self, duration: timedelta | int) -> None:
        """Time the key out ``duration`` (or that many ms; a timedelta is floored to whole
        ms) after this batch's time."""
        if self._timeout != "processing_time":
            raise InvalidArgument("set_timeout_duration needs timeout='processing_time'")
        ms = duration_ms(duration) if isinstance(duration, timedelta) else duration
        if ms <= 0:
            raise InvalidArgument(f"timeout duration must be positive, got {duration!r}")
        self.timeout_at_ms = self.batch_time_ms + ms

    def set_timeout_timestamp(self, timestamp: datetime | int) -> None:
        """Time the key out once the watermark passes ``timestamp`` (a datetime, naive ones
        read in the session time zone, or ms since the epoch); not earlier than the current
        watermark, as in Spark."""
        if self._timeout != "event_time":
            raise InvalidArgument("set_timeout_timestamp needs timeout='event_time'")
        zone = self._time_zone
        ms = datetime_ms(timestamp, zone) if isinstance(timestamp, datetime) else timestamp
        if self.watermark_ms is not None and ms < self.watermark_ms:
            raise InvalidArgument(
                f"timeout timestamp {ms} ms is earlier than the current watermark "
                f"{self.watermark_ms} ms"
            )
        self.timeout_at_ms = ms


@dataclass(frozen=True)
class _GroupsWithState:
    key_columns: tuple[str, ...]
    func: GroupFunction
    ttl_ms: int | None
    timeout: TimeoutKind = "processing_time"

    def __call__(self, store: StateStore, rows: pa.Table) -> Iterator[tuple[Any, ...]]:
        batch = current_batch()
        key_idx = [rows.column_names.index(c) for c in self.key_columns]
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        columns = [rows.column(i).to_pylist() for i in range(rows.num_columns)]
        for row in zip(*columns, strict=True):
            groups.setdefault(tuple(row[i] for i in key_idx), []).append(row)
        stored = store.get_many(groups)  # one vectorised lookup for the batch's keys
        for (key, key_rows), value in zip(groups.items(), stored, strict=True):
            yield from self._call(store, key, value, key_rows, batch, timed_out=False)
        for key, value in self._expired(store, batch):
            if key not in groups:
                yield from self._call(store, key, value, [], batch, timed_out=True)

    def _expired(
        self, store: StateStore, batch: BatchContext
    ) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """Keys whose timeout has passed (processing time: at or before the batch's time;
        event time: before the watermark, as Spark), found in one vectorised pass per run."""
        if self.timeout == "event_time":
            if batch.watermark_ms is None:
                return []
            bound, compare = batch.watermark_ms, pc.less
        else:
            bound, compare = batch.batch_time_ms, pc.less_equal
        started = time.perf_counter()
        expired = store.matching(
            lambda _keys, values: compare(pc.struct_field(values, TIMEOUT_FIELD), bound)
        )
        batch.event_time.evict_ms += (time.perf_counter() - started) * 1000
        if not expired.num_rows:
            return []
        keys = struct_rows(expired.column("key").combine_chunks())
        values = struct_rows(expired.column("value").combine_chunks())
        return [
            (k, v) for k, v in zip(keys, values, strict=True) if k is not None and v is not None
        ]

    def _call(
        self,
        store: StateStore,
        key: tuple[Any, ...],
        stored: tuple[Any, ...] | None,
        rows: list[tuple[Any, ...]],
        batch: BatchContext,
        *,
        timed_out: bool,
    ) -> Iterator[tuple[Any, ...]]:
        batch_time = batch.batch_time_ms
        state = GroupState(
            None if stored is None else stored[:-1],
            batch_time,
            timed_out,
            timeout=self.timeout,
            watermark_ms=batch.watermark_ms,
            time_zone=batch.time_zone,
        )
        if stored is not None and not timed_out:
            state.timeout_at_ms = stored[-1]
        out = self.func(key, rows, state)
        if out is not None:
            yield from out
        if state._removed or (timed_out and not state._changed):
            store.remove(key)
            batch.event_time.evicted += timed_out
            return
        if state._changed or (state.exists and state.timeout_at_ms != (stored or (None,))[-1]):
            timeout = state.timeout_at_ms
            if self.ttl_ms is not None and state._changed:
                timeout = batch_time + self.ttl_ms
            assert state._value is not None
            store.put(key, (*state._value, timeout))


def map_groups_with_state(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str | StructType,
    state_schema: str | StructType,
    output_schema: str | StructType,
    func: GroupFunction,
    num_partitions: int,
    *,
    ttl: timedelta | None = None,
    timeout: TimeoutKind = "processing_time",
    event_time_column: str | None = None,
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
    schema_change: SchemaChange | None = None,
) -> StatefulOperator:
    """An operator calling ``func(key, rows, state)`` per key with new rows, and once more for
    each key whose timeout (or ``ttl`` since its last update) has passed.

    ``timeout="event_time"`` makes timeouts follow the query's watermark
    (``state.set_timeout_timestamp``) and drops input rows at or before the watermark on the
    watermark's column, as Spark's ``EventTimeTimeout``; ``event_time_column`` names the column late
    rows are judged on instead (in either timeout mode).
    ``schema_change`` declares renamed or dropped state fields (a new nullable field needs
    no declaration; older keys' states read it as None)."""
    if timeout not in ("processing_time", "event_time"):
        raise InvalidArgument(f"timeout must be 'processing_time' or 'event_time', got {timeout!r}")
    if ttl is not None and timeout == "event_time":
        raise InvalidArgument("ttl is a processing-time timeout; it cannot be used with event time")
    state_struct = parse_schema(state_schema)
    if TIMEOUT_FIELD in state_struct.names:
        raise InvalidArgument(f"state field name {TIMEOUT_FIELD!r} is reserved")
    stored = StructType([*state_struct.fields, StructField(TIMEOUT_FIELD, LongType(), True)])
    ttl_ms = None if ttl is None else duration_ms(ttl)
    if ttl_ms is not None and ttl_ms <= 0:
        raise InvalidArgument(f"ttl must be positive, got {ttl}")
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(key_columns),
        key_schema=key_schema,
        value_schema=stored,
        output_schema=output_schema,
        update=_GroupsWithState(tuple(key_columns), func, ttl_ms, timeout),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
        late_column=event_time_column,
        uses_event_time=timeout == "event_time",
        late_on_watermark=timeout == "event_time",
        kind="map_groups_with_state",
        reads=ColumnUse.event_time(event_time_column),
        schema_change=schema_change or SchemaChange(),
    )
