"""Session windows over event time, as Spark's ``groupBy(keys, session_window(ts, gap))``
aggregation with a watermark (append mode).

As Spark's analyzer and ``MergingSessionsExec``: a row at time ``t`` with gap ``g`` opens the
session ``[t, t + g)``; rows with a null time, or a null or non-positive gap (a per-row gap
column), belong to no session. A row is late, and dropped, when its own session ends at or
before the previous batch's watermark (``t + g <= watermark``, Spark's late-row predicate on
the session's end). The batch's sessions of a key are merged with the key's stored sessions:
sorted by start, a session whose start is at or before the end of the one being built
(``start <= end``, so touching sessions merge) joins it and stretches its end; so a late row
that is not dropped can merge two stored sessions into one. After the merge, every session
whose end is at or before the batch's own watermark is closed: removed from the state and
emitted once, with its final aggregates (append mode). Spark refuses update mode for session
windows (``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION``): a merge would supersede sessions
already emitted, so this refuses it too, on the driver.

State: one row per key (the key columns), its value the key's open sessions, sorted by start
(so the first one ends first): ``sessions array<struct<start, end, aggregates...>>``. A batch
reads the stored sessions of its keys in one vectorised lookup, merges in Arrow/numpy and
writes the keys' new lists in one bulk update; eviction is one predicate pass (the first
session's end) and one bulk update per partition.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, StructField, StructType, TimestampType

from state_runtime.errors import InvalidArgument, QueryRefused
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.aggregation import Agg, aggregate_reads, aggregate_schema
from state_runtime.runtime.context import current_batch
from state_runtime.runtime.operator import ColumnUse, StatefulOperator
from state_runtime.runtime.times import (
    MICROS_PER_MS,
    duration_micros,
    event_micros,
    interval,
    null_times,
    plus_days,
)
from state_runtime.runtime.watermark import is_late
from state_runtime.store.config import StoreConfig
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

SESSIONS = "sessions"
"""The value field holding a key's open sessions."""
SESSION_COLUMN = "session_window"
"""The output column: ``struct<start: timestamp, end: timestamp>``, as Spark's."""
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
"""How the aggregate of merged sessions combines theirs."""


@dataclass(frozen=True)
class SessionWindow:
    """``SessionWindow(timedelta(minutes=5))``: a static gap (an exact duration);
    ``SessionWindow("gap")``: each row's gap from the input's string column ``gap``
    (``'5 seconds'``, ``'interval 1 minute'``), as Spark's ``session_window(ts, gap_column)``
    casts it: days and weeks are calendar days in the session time zone."""

    gap: timedelta | str

    def __post_init__(self) -> None:
        if isinstance(self.gap, timedelta) and self.gap <= timedelta(0):
            raise InvalidArgument(f"a session gap must be positive, got {self.gap}")
        if isinstance(self.gap, str) and not self.gap:
            raise InvalidArgument("a session gap column needs a name")

    def ends(self, rows: pa.Table, start: np.ndarray, zone: str) -> np.ndarray:
        """Each row's session end (microseconds) for rows starting at ``start``; ``start``
        itself where the gap is null or not an interval (such rows open no session)."""
        if isinstance(self.gap, timedelta):
            return start + duration_micros(self.gap)
        encoded = pc.dictionary_encode(rows.column(self.gap).combine_chunks())
        parsed = [interval(text) or (0, 0) for text in encoded.dictionary.to_pylist()]
        index = np.asarray(encoded.indices.fill_null(len(parsed)).to_numpy(), dtype=np.int64)
        days = np.array([d for d, _ in parsed] + [0], dtype=np.int64)[index]
        micros = np.array([m for _, m in parsed] + [0], dtype=np.int64)[index]
        ends = start + micros
        for row in np.flatnonzero(days != 0):
            ends[row] = plus_days(int(start[row]), int(days[row]), zone) + int(micros[row])
        return ends


@dataclass(frozen=True)
class _Pieces:
    """Sessions to merge, sorted by (key, start): a batch's rows and its keys' stored ones."""

    group: np.ndarray
    start: np.ndarray
    end: np.ndarray
    values: pa.Table
    """The pieces' aggregates (one column per aggregate)."""


@dataclass(frozen=True)
class _SessionAggregate:
    key_columns: tuple[str, ...]
    time_column: str
    window: SessionWindow
    aggs: tuple[Agg, ...]

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        batch = current_batch()
        assert batch.watermark_ms is not None and batch.late_rows_watermark_ms is not None
        closed: list[pa.Table] = []
        rows, start, end = self._sessions_of_rows(
            rows, batch.late_rows_watermark_ms, batch.time_zone
        )
        bound = batch.watermark_ms * MICROS_PER_MS
        started = time.perf_counter()
        if rows.num_rows:
            keys, pieces = self._pieces(store, rows, start, end)
            merged = _merge(pieces, self.aggs)
            closing = merged.column("end").to_numpy() <= bound
            closed.append(self._output(keys, merged.filter(pa.array(closing))))
            store.apply_arrow(_lists(store, keys, merged.filter(pa.array(~closing)), len(keys)))
        closed.append(self._evict(store, bound))
        stats = batch.event_time
        emitted = pa.concat_tables(closed)
        stats.evicted += emitted.num_rows
        stats.evict_ms += (time.perf_counter() - started) * 1000
        return emitted if emitted.num_rows else None

    def _sessions_of_rows(
        self, rows: pa.Table, late_ms: int, zone: str
    ) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """The rows that open a session (a time, and an end after it: Spark's filter) and
        are not late, with their sessions' bounds."""
        start = event_micros(rows.column(self.time_column), self.time_column)
        timed = ~null_times(start)
        end = np.where(timed, self.window.ends(rows, np.where(timed, start, 0), zone), 0)
        opens = timed & (end > start)
        late = opens & is_late(end, late_ms)
        current_batch().event_time.late_rows += int(np.count_nonzero(late))
        keep = opens & ~late
        return rows.filter(pa.array(keep)), start[keep], end[keep]

    def _pieces(
        self, store: StateStore, rows: pa.Table, start: np.ndarray, end: np.ndarray
    ) -> tuple[pa.StructArray, _Pieces]:
        """The batch's keys (as state keys) and every piece to merge, sorted."""
        order = "__session_row"
        numbered = rows.select(list(self.key_columns)).append_column(
            order, pa.array(np.arange(rows.num_rows))
        )
        grouped = numbered.group_by(list(self.key_columns), use_threads=False).aggregate(
            [(order, "list")]
        )
        key_type = store.schema.key_arrow
        keys = pa.StructArray.from_arrays(
            [
                grouped.column(c).combine_chunks().cast(key_type.field(i).type)
                for i, c in enumerate(self.key_columns)
            ],
            fields=list(key_type),
        )
        members = grouped.column(f"{order}_list").combine_chunks()
        row_index = np.asarray(pc.list_flatten(members).to_numpy(), dtype=np.int64)
        row_group = np.asarray(pc.list_parent_indices(members).to_numpy(), dtype=np.int64)
        element = store.schema.value_arrow.field(SESSIONS).type.value_type
        row_values = self._row_values(rows.take(pa.array(row_index)), element)
        stored = pc.struct_field(store.lookup(keys), SESSIONS)
        old = pc.list_flatten(stored)
        old_group = np.asarray(pc.list_parent_indices(stored).to_numpy(), dtype=np.int64)
        old_table = pa.Table.from_struct_array(old)
        group = np.concatenate([row_group, old_group])
        begin = np.concatenate([start[row_index], _micros(old_table.column("start"))])
        finish = np.concatenate([end[row_index], _micros(old_table.column("end"))])
        values = pa.concat_tables([row_values, old_table.drop_columns(["start", "end"])])
        sort = np.lexsort((begin, group))
        pieces = _Pieces(group[sort], begin[sort], finish[sort], values.take(pa.array(sort)))
        return keys, pieces

    def _row_values(self, rows: pa.Table, element: pa.StructType) -> pa.Table:
        """Each row as a session's aggregates (a count of 1, the row's value otherwise)."""
        columns = [
            pa.array(np.ones(rows.num_rows, dtype=np.int64))
            if a.function == "count"
            else rows.column(a.column).combine_chunks().cast(element.field(a.name).type)
            for a in self.aggs
        ]
        return pa.Table.from_arrays(columns, names=[a.name for a in self.aggs])

    def _evict(self, store: StateStore, bound: int) -> pa.Table:
        """Close every stored session whose end is at or before ``bound`` (one predicate
        pass: a key's first session ends first) and emit them."""
        found = store.matching(
            lambda _keys, values: pc.less_equal(
                pc.struct_field(pc.list_element(pc.struct_field(values, 0), 0), 1).cast(pa.int64()),
                bound,
            )
        )
        keys = found.column("key").combine_chunks()
        sessions = pc.struct_field(found.column("value").combine_chunks(), SESSIONS)
        flat = pa.Table.from_struct_array(pc.list_flatten(sessions))
        group = np.asarray(pc.list_parent_indices(sessions).to_numpy(), dtype=np.int64)
        flat = flat.append_column("__group", pa.array(group))
        closing = pa.array(_micros(flat.column("end")) <= bound)
        if len(keys):
            store.apply_arrow(_lists(store, keys, flat.filter(pc.invert(closing)), len(keys)))
        return self._output(keys, flat.filter(closing))

    def _output(self, keys: pa.StructArray, sessions: pa.Table) -> pa.Table:
        """Closed sessions as output rows: key columns, ``session_window``, aggregates."""
        owners = keys.take(sessions.column("__group").combine_chunks())
        window = pa.StructArray.from_arrays(
            [_timestamps(sessions.column("start")), _timestamps(sessions.column("end"))],
            names=["start", "end"],
        )
        names = [a.name for a in self.aggs]
        return pa.Table.from_arrays(
            [*owners.flatten(), window, *(sessions.column(n) for n in names)],
            names=[*self.key_columns, SESSION_COLUMN, *names],
        )


def _micros(column: Any) -> np.ndarray:
    """Timestamps (or int64 microseconds) as an int64 numpy array."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _timestamps(column: Any) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def _merge(pieces: _Pieces, aggs: Sequence[Agg]) -> pa.Table:
    """Merged sessions, sorted by (key, start): ``__group``, ``start``, ``end`` (int64
    microseconds) and the aggregates. Within a key, a piece starting at or before the running
    end of the session being built joins it (Spark's ``MergingSessionsIterator``)."""
    group, start, end = pieces.group, pieces.start, pieces.end
    first = np.ones(len(group), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    reach = pd.Series(end).groupby(group).cummax().to_numpy()
    new = first.copy()
    new[1:] |= start[1:] > reach[:-1]
    session = np.cumsum(new) - 1
    heads = np.flatnonzero(new)
    table = pieces.values.append_column("__session", pa.array(session))
    merged = table.group_by("__session", use_threads=False).aggregate(
        [(a.name, _MERGE[a.function]) for a in aggs]
    )
    merged = merged.sort_by("__session")
    columns = [merged.column(f"{a.name}_{_MERGE[a.function]}") for a in aggs]
    return pa.Table.from_arrays(
        [
            pa.array(group[heads]),
            pa.array(start[heads]),
            pa.array(np.maximum.reduceat(end, heads) if len(heads) else end[:0]),
            *columns,
        ],
        names=["__group", "start", "end", *(a.name for a in aggs)],
    )


def _lists(store: StateStore, keys: pa.StructArray, sessions: pa.Table, count: int) -> pa.Table:
    """State rows of ``keys``: each key's sessions (rows of ``sessions`` with ``__group`` its
    index, sorted) as its list; a key without sessions gets a null value (removed)."""
    value_type = store.schema.value_arrow
    element = value_type.field(SESSIONS).type.value_type
    group = np.asarray(sessions.column("__group").combine_chunks().to_numpy(), dtype=np.int64)
    counts = np.bincount(group, minlength=count)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    items = pa.StructArray.from_arrays(
        [
            _timestamps(sessions.column(f.name)).cast(f.type)
            if f.name in ("start", "end")
            else sessions.column(f.name).combine_chunks().cast(f.type)
            for f in element
        ],
        fields=list(element),
    )
    lists = pa.ListArray.from_arrays(offsets, items, type=value_type.field(SESSIONS).type)
    values = pa.StructArray.from_arrays(
        [lists], fields=list(value_type), mask=pa.array(counts == 0)
    )
    return pa.table({"key": keys, "value": values})


def session_window_aggregation(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str,
    time_column: str,
    window: SessionWindow,
    aggs: Sequence[Agg],
    num_partitions: int,
    *,
    output_mode: str = "append",
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
) -> StatefulOperator:
    """``aggs`` per key and session of ``time_column`` (a timestamp), as Spark's
    ``groupBy(keys, session_window(time_column, gap)).agg(...)``: append mode only.

    Output columns: the key columns, ``session_window`` (struct of ``start`` and ``end``) and
    the aggregate names. Needs a query watermark on ``time_column``; at least one key column
    (Spark refuses a session window without another grouping key)."""
    if output_mode != "append":
        raise QueryRefused(
            f"session window aggregation (operator {operator_id}): output mode {output_mode!r} "
            "(rule: Spark supports only append mode for session windows; a merge supersedes "
            "sessions already emitted)"
        )
    if not aggs:
        raise InvalidArgument("session_window_aggregation needs at least one aggregate")
    key_struct = parse_schema(key_schema)
    if SESSION_COLUMN in key_struct.names:
        raise InvalidArgument(f"key column name {SESSION_COLUMN!r} is reserved")
    values = aggregate_schema(aggs)
    bounds = [
        StructField("start", TimestampType(), True),
        StructField("end", TimestampType(), True),
    ]
    session = StructType([*bounds, *values.fields])
    output = StructType(
        [*key_struct.fields, StructField(SESSION_COLUMN, StructType(bounds), True), *values.fields]
    )
    gap = window.gap
    gap_reads = (ColumnUse(gap, "session gap column", "string"),) if isinstance(gap, str) else ()
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(key_columns),
        key_schema=key_struct,
        value_schema=StructType([StructField(SESSIONS, ArrayType(session, True), True)]),
        output_schema=output,
        update=_SessionAggregate(tuple(key_columns), time_column, window, tuple(aggs)),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
        uses_event_time=True,
        kind="session window aggregation",
        passes_on="keys",
        reads=(
            ColumnUse(time_column, "session window time column", "timestamp"),
            *gap_reads,
            *aggregate_reads(aggs),
        ),
        window_column=time_column,
        output_mode="append",
    )
