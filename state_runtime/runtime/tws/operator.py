"""``transform_with_state``: a user's pyspark ``StatefulProcessor``, unchanged, on our stores.

Per state partition and batch, as Spark's ``TransformWithStateInPandasExec`` does: a fresh
copy of the processor gets ``init(handle)``; on the query's first batch each key of the
initial state gets ``handleInitialState``; each key with rows (in key order) gets
``handleInputRows`` (the pandas form hands the key as Spark's worker reads it from its
pandas frame: a null is ``nan`` or ``NaT``); then every timer due (processing time: before
the batch's time; event time: before the watermark; Spark's strict ``<``) fires once, in
(time, key) order, with ``handleExpiredTimer`` and is deleted; values whose TTL passed are
removed; ``close()``. The handle is :class:`Handle`; state variables are stores of the
operator (:mod:`.variables`), timers the main store :data:`TIMERS_STORE`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import (
    AtomicType,
    LongType,
    Row,
    StructField,
    StructType,
    TimestampType,
)

from state_runtime.errors import InvalidArgument
from state_runtime.runtime.context import current_batch
from state_runtime.runtime.operator import ColumnUse, StatefulOperator
from state_runtime.runtime.times import time_zone
from state_runtime.runtime.tws.variables import (
    EXPIRY,
    HEAD,
    STATES,
    TIMERS_STORE,
    Buffered,
    Declarations,
    ListState,
    MapState,
    Scope,
    ValueState,
    Variable,
    deleted_store,
    expire,
)
from state_runtime.store.arrow_rows import struct_rows
from state_runtime.store.config import StoreConfig
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}
OUTPUT_MODES = {"update": "update", "append": "append"}
INITIAL_PARTITION = "__state_partition"


class Handle:
    """Spark's ``StatefulProcessorHandle`` for one task: the declared variables and the
    grouping key's timers."""

    def __init__(
        self, scope: Scope, variables: dict[str, Variable], timers: StateStore, time_mode: str
    ) -> None:
        self._scope, self._variables, self._timers = scope, variables, timers
        self._time_mode = time_mode

    def _state(self, name: str) -> Any:
        variable = self._variables.get(name)
        if variable is None:
            raise InvalidArgument(
                f"state variable {name!r} was not declared when the operator was built "
                "(init() must declare the same variables on every call)"
            )
        return STATES[variable.kind](self._scope, variable)

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        state: ValueState = self._state(stateName)
        return state

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        state: ListState = self._state(stateName)
        return state

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> Any:
        state: MapState = self._state(stateName)
        return state

    def deleteIfExists(self, stateName: str) -> None:
        """Remove every value of the variable, for every key of this partition: a declared
        variable, or one ``init`` no longer declares whose store the query opened (as Spark
        removes its column family)."""
        store = self._scope.stores.get(stateName)
        if store is not None:
            store.remove_all()

    def _timers_allowed(self, what: str) -> None:
        if self._time_mode == "None":
            raise InvalidArgument(f"{what} needs timeMode 'ProcessingTime' or 'EventTime'")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._timers_allowed("registerTimer")
        at = int(expiryTimestampMs)
        self._timers.put((*self._scope.key, at), (at,))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timers_allowed("deleteTimer")
        self._timers.remove((*self._scope.key, int(expiryTimestampMs)))

    def listTimers(self) -> Iterator[int]:
        self._timers_allowed("listTimers")
        return iter([int(key[-1]) for key, _ in self._timers.prefix_scan(self._scope.key)])


def declare(processor: StatefulProcessor, time_mode: str) -> Declarations:
    """The processor's state variables (and those it deletes without declaring them):
    ``init`` run on a copy with a recording handle."""
    declarations = Declarations(time_mode)
    probe = copy.deepcopy(processor)
    probe.init(declarations)  # type: ignore[arg-type]
    probe.close()
    return declarations


def _public_row(names: list[str], values: tuple[Any, ...]) -> Row:
    """A Row of ``values`` named ``names``, built as pyspark's public API builds it."""
    return Row(*names)(*values)


def _row_builder() -> Callable[[list[str], tuple[Any, ...]], Row]:
    """pyspark's own Row builder (what ``Row(*names)(*values)`` calls, without its per-row
    argument check: 2x faster per input row), or :func:`_public_row` where this pyspark
    lacks that private function."""
    try:
        from pyspark.sql.types import _create_row
    except ImportError:
        return _public_row
    return _create_row


_make_row = _row_builder()


@dataclass(frozen=True)
class _Converted:
    """A table as the processor is handed it: ``rows(start, stop)`` its rows ``start:stop``,
    ``key(start, key)`` the key (stored as ``key``) of the rows from ``start``."""

    rows: Callable[[int, int], Iterator[Any]]
    key: Callable[[int, tuple[Any, ...]], tuple[Any, ...]]


@dataclass(frozen=True)
class _Form:
    """How rows reach the processor and its output comes back: pandas or Rows; ``operator``
    names the operator in errors about its output."""

    pandas: bool
    output: StructType
    operator: str

    def rows(self, table: pa.Table, zone: str, key_columns: Sequence[str]) -> _Converted:
        """``table`` as the processor's ``rows`` argument (timestamps as Spark gives them:
        naive wall-clock times of the session zone) and its keys; converted once, each
        call slices it."""
        if self.pandas:
            import pandas as pd  # the pandas form's workers alone pay for importing pandas

            frame = table.to_pandas()
            for field in table.schema:
                if pa.types.is_timestamp(field.type):
                    frame[field.name] = _local(frame[field.name], zone)
            # Spark's worker takes the key from its converted frame's rows (``itertuples``,
            # which iterates each column): a null is the column's pandas null (``nan`` for a
            # string or an int, ``NaT``), and a batch's other int keys are floats with it
            columns = [list(frame[c]) for c in key_columns]

            def frames(start: int, stop: int) -> Iterator[Any]:
                part = frame.iloc[start:stop]
                part.index = pd.RangeIndex(stop - start)
                return iter([part])

            return _Converted(frames, lambda start, _key: tuple(c[start] for c in columns))
        local = _local_table(table, zone)
        names = table.column_names
        rows = [_make_row(names, r) for r in zip(*local.to_pydict().values(), strict=True)]
        return _Converted(lambda start, stop: iter(rows[start:stop]), lambda _start, key: key)

    @cached_property
    def _stamps(self) -> list[str]:
        """The output's timestamp columns."""
        return [f.name for f in self.output.fields if isinstance(f.dataType, TimestampType)]

    def keep(self, produced: Iterable[Any] | None, into: list[Any], zone: str) -> None:
        """Take the processor's output now (a generator reads state as it runs): frames
        narrowed to the output's columns (a missing one raises here), naive timestamps as
        wall-clock times of ``zone``."""
        if not self.pandas:
            into.extend(produced or ())
            return
        names, stamps = self.output.names, self._stamps
        for item in produced or ():
            frame = item if list(item.columns) == names else item[names]
            if stamps:  # localised on a copy: the user's frame stays as it was
                frame = frame.copy(deep=False)
            for name in stamps:
                column = frame[name]
                if getattr(column.dt, "tz", None) is None:
                    frame[name] = column.dt.tz_localize(
                        time_zone(zone), ambiguous="NaT", nonexistent="shift_forward"
                    )
            into.append(frame)

    def table(self, produced: list[Any], zone: str) -> pa.Table:
        """The output kept, as one table of the output schema (UTC timestamps)."""
        schema = to_arrow_schema(self.output, timezone="UTC")
        if not produced:
            return schema.empty_table()
        if not self.pandas:
            return _row_table(produced, self.output, schema, zone, self.operator)
        import pandas as pd

        frame = pd.concat(produced, ignore_index=True) if len(produced) > 1 else produced[0]
        return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


def _local(series: Any, zone: str) -> Any:
    return series.dt.tz_convert(time_zone(zone)).dt.tz_localize(None)


def _local_table(table: pa.Table, zone: str) -> pa.Table:
    """Timestamp columns as naive wall-clock times of ``zone`` (Row form)."""
    columns = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            column = pc.local_timestamp(column.cast(pa.timestamp("us", tz=zone)))
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _row_table(
    rows: list[Any], output: StructType, schema: pa.Schema, zone: str, operator: str
) -> pa.Table:
    """The processor's output Rows and tuples as a table of ``schema``: Rows with field names
    by name, the others by position (a typed error naming ``operator`` where their width is
    not the output's)."""
    names = output.names
    nested = any(not isinstance(f.dataType, AtomicType) for f in output.fields)
    if not nested and not any(isinstance(f.dataType, TimestampType) for f in output.fields):
        # flat rows in the output's order (Rows with its field names, or tuples of its
        # width) go in by column: 10x cheaper than a dict per row
        width = len(names)
        if all(
            isinstance(r, tuple) and getattr(r, "__fields__", names) == names and len(r) == width
            for r in rows
        ):
            columns = zip(*rows, strict=True)
            return pa.Table.from_arrays(
                [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
            )
    # a Row's nested Rows become dicts only when the output has nested fields: the recursive
    # asDict costs more than the rest of a key's work
    records = []
    for row in rows:
        if isinstance(row, Row) and hasattr(row, "__fields__"):
            record = row.asDict(nested)
        elif len(row) == len(names):
            record = dict(zip(names, row, strict=True))
        else:
            raise InvalidArgument(
                f"{operator} returned a row of {len(row)} values; its output schema has "
                f"{len(names)} columns ({', '.join(names)})"
            )
        for field in output.fields:
            value = record.get(field.name)
            if (
                isinstance(field.dataType, TimestampType)
                and isinstance(value, datetime)
                and value.tzinfo is None
            ):
                record[field.name] = value.replace(tzinfo=time_zone(zone))
        records.append(record)
    return pa.Table.from_pylist(records, schema=schema)


@dataclass(frozen=True)
class _TransformWithState:
    key_columns: tuple[str, ...]
    processor: StatefulProcessor
    variables: dict[str, Variable]
    time_mode: str
    form: _Form
    initial: pa.Table | None
    deleted: tuple[str, ...]
    """Variables ``init`` deletes without declaring them: their stores, when the query
    opened them (the catalog knew them), are there for ``deleteIfExists`` only."""

    def __call__(self, timers: StateStore, rows: pa.Table) -> pa.Table:
        batch = current_batch()
        zone = batch.time_zone
        names = [*self.variables, *(n for n in self.deleted if n in batch.stores)]
        stores = {name: Buffered(batch.stores[name]) for name in names}
        scope = Scope(stores, batch.batch_time_ms)
        processor = copy.deepcopy(self.processor)
        processor.init(Handle(scope, self.variables, timers, self.time_mode))  # type: ignore[arg-type]
        watermark = -1 if batch.watermark_ms is None else batch.watermark_ms
        values = (
            TimerValues()
            if self.time_mode == "None"
            else TimerValues(batch.batch_time_ms, watermark)
        )
        out: list[Any] = []
        table, groups = _groups(rows, self.key_columns)
        inputs = self.form.rows(table, zone, self.key_columns)
        initial: dict[tuple[Any, ...], tuple[int, int]] = {}
        if self.initial is not None and timers.version == 0:
            mine = self.initial.filter(
                pc.equal(self.initial.column(INITIAL_PARTITION), batch.partition_id)
            ).drop_columns([INITIAL_PARTITION])
            initial_table, initial = _groups(mine, self.key_columns)
            states = self.form.rows(initial_table, zone, self.key_columns)
        keys = sorted(set(groups) | set(initial), key=_order)
        for variable in self.variables.values():
            _prefetch(stores[variable.name], variable, keys)
        for key in keys:
            scope.key = key
            if key in initial:
                start, stop = initial[key]
                handed = states.key(start, key)
                for state in states.rows(start, stop):  # a frame, or each Row
                    processor.handleInitialState(handed, state, values)
            if key in groups:
                start, stop = groups[key]
                produced = processor.handleInputRows(
                    inputs.key(start, key), inputs.rows(start, stop), values
                )
                self.form.keep(produced, out, zone)
        self._fire(processor, timers, scope, values, zone, out)
        for variable in self.variables.values():
            expire(stores[variable.name], variable, batch.batch_time_ms)
        processor.close()
        for store in stores.values():
            store.flush()
        return self.form.table(out, zone)

    def _fire(
        self,
        processor: StatefulProcessor,
        timers: StateStore,
        scope: Scope,
        values: TimerValues,
        zone: str,
        out: list[Any],
    ) -> None:
        """Every timer due, once, in (time, key) order."""
        if self.time_mode == "None":
            return
        bound = (
            values.getCurrentProcessingTimeInMs()
            if self.time_mode == "ProcessingTime"
            else values.getCurrentWatermarkInMs()
        )
        due = timers.matching(lambda _k, v: pc.less(pc.struct_field(v, EXPIRY), bound))
        keys = [k for k in struct_rows(due.column("key").combine_chunks()) if k is not None]
        for stored in sorted(keys, key=lambda k: (k[-1], _order(k[:-1]))):
            key, at = stored[:-1], int(stored[-1])
            scope.key = key
            produced = processor.handleExpiredTimer(key, values, ExpiredTimerInfo(at))
            self.form.keep(produced, out, zone)
            timers.remove(stored)


def _prefetch(store: Buffered, variable: Variable, keys: list[tuple[Any, ...]]) -> None:
    """Read what the batch's keys will read first, in one lookup: a value, a list's head."""
    if variable.kind == "value":
        store.prefetch(keys)
    elif variable.kind == "list":
        store.prefetch([(*k, HEAD) for k in keys])


def _order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Keys sort with nulls first, as Spark's."""
    return tuple((v is not None, v) for v in key)


def _groups(
    table: pa.Table, key_columns: Sequence[str]
) -> tuple[pa.Table, dict[tuple[Any, ...], tuple[int, int]]]:
    """``table`` with each key's rows together (in their order), and each key's rows in it
    as ``(start, stop)``; keys as tuples of Python values."""
    if not table.num_rows:
        return table, {}
    keys = list(zip(*(table.column(c).to_pylist() for c in key_columns), strict=True))
    positions: dict[tuple[Any, ...], list[int]] = {}
    for i, key in enumerate(keys):
        positions.setdefault(key, []).append(i)
    spans: dict[tuple[Any, ...], tuple[int, int]] = {}
    order: list[int] = []
    for key, rows in positions.items():
        spans[key] = (len(order), len(order) + len(rows))
        order += rows
    return table.take(pa.array(order, pa.int64())), spans


def transform_with_state(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str | StructType,
    stateful_processor: StatefulProcessor,
    output_schema: str | StructType,
    num_partitions: int,
    *,
    output_mode: str = "Update",
    time_mode: str = "None",
    initial_state: DataFrame | None = None,
    event_time_column: str | None = None,
    pandas: bool = True,
    config: StoreConfig | None = None,
) -> StatefulOperator:
    """An operator running ``stateful_processor`` (a subclass of pyspark's
    ``StatefulProcessor``, unchanged) per key, as ``groupBy(key_columns)`` followed by
    ``transformWithStateInPandas`` (``pandas=True``) or ``transformWithState`` (Rows).

    ``time_mode``: ``"None"``, ``"ProcessingTime"`` (timers and TTL on the batch's time) or
    ``"EventTime"`` (timers on the query's watermark, which it then needs).
    ``initial_state``: a DataFrame with the key columns, read once here (``toArrow``) and
    given to ``handleInitialState`` in the query's first batch. ``"EventTime"`` drops input
    rows at or before the watermark on the watermark's column, as Spark;
    ``event_time_column`` names the column late rows are judged on instead."""
    mode = TIME_MODES.get(str(time_mode).lower())
    if mode is None:
        raise InvalidArgument(
            f"time_mode must be one of None, ProcessingTime, EventTime; got {time_mode!r}"
        )
    out_mode = OUTPUT_MODES.get(str(output_mode).lower())
    if out_mode is None:
        raise InvalidArgument(
            f"output_mode must be Update or Append for transformWithState, got {output_mode!r}"
        )
    if event_time_column is not None and mode != "EventTime":
        raise InvalidArgument("event_time_column needs time_mode='EventTime'")
    grouping = parse_schema(key_schema)
    declared = declare(stateful_processor, mode)
    variables = declared.variables
    timers_key = StructType([*grouping.fields, StructField(EXPIRY, LongType(), False)])
    timers_value = StructType([StructField(EXPIRY, LongType(), True)])
    initial = None
    if initial_state is not None:
        missing = [c for c in key_columns if c not in initial_state.columns]
        if missing:
            raise InvalidArgument(f"initial_state lacks the key columns {missing}")
        keys = [F.col(f"`{c}`") for c in key_columns]
        initial = initial_state.select(
            "*", F.pmod(F.hash(*keys), F.lit(num_partitions)).alias(INITIAL_PARTITION)
        ).toArrow()
    form = _Form(
        pandas, parse_schema(output_schema), f"transform_with_state (operator {operator_id})"
    )
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(key_columns),
        key_schema=timers_key,
        value_schema=timers_value,
        output_schema=output_schema,
        update=_TransformWithState(
            tuple(key_columns), stateful_processor, variables, mode, form, initial, declared.deleted
        ),
        num_partitions=num_partitions,
        store_name=TIMERS_STORE,
        config=replace(config or StoreConfig(), scan_prefix=len(grouping.fields)),
        late_column=event_time_column,
        uses_event_time=mode == "EventTime",
        late_on_watermark=mode == "EventTime",
        kind="transform_with_state",
        reads=ColumnUse.event_time(event_time_column),
        output_mode=out_mode,  # type: ignore[arg-type]
        extra_stores=(
            *(v.store(grouping) for v in variables.values()),
            *map(deleted_store, declared.deleted),
        ),
        derived_key_fields=1,
    )
