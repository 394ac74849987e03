"""The ``StatefulProcessor`` classes the ``transform_with_state`` tests run on both engines,
unchanged: each in a pandas and a Row form (the same logic, Spark's two output types), and
the differential harness's :class:`~.differential.Operator` entries for them.

The clock: Spark's batch time cannot be set from Python, so processing-time behaviour is made
deterministic by durations no batch can be faster than (a TTL of 1 ms is past in the next
batch, a timer 1 ms ahead fires in the next batch; one hour never passes)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from state_runtime.runtime import StatefulOperator, StatefulQuery, Watermark
from state_runtime.runtime.tws import transform_with_state

from .differential import Operator, Rows, Stream

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HOUR_MS = 3_600_000
KEY = "part int, user string"


def _emit(pandas: bool, rows: list[dict[str, Any]]) -> Iterator[Any]:
    """The processor's output in its form: one DataFrame, or Rows."""
    if not rows:
        return
    if pandas:
        yield pd.DataFrame(rows)
    else:
        yield from (Row(**r) for r in rows)


def _records(rows: Any, pandas: bool) -> list[dict[str, Any]]:
    """The input rows of a key as dicts, whatever the form."""
    if pandas:
        return [r for frame in rows for r in frame.to_dict("records")]
    return [r.asDict() for r in rows]


def _user(key: Any) -> Any:
    """The key's ``user`` for a string output column: Spark's pandas form hands a null key as
    a float ``nan``, which its worker cannot write to a string column, so a null is output as
    ``None`` (what the Row form hands already)."""
    return None if pd.isna(key[1]) else key[1]


# --- a session tracker: a list with a long TTL, a value with a 1 ms TTL, timers -------------


class SessionTracker(StatefulProcessor):
    """Keeps a key's amounts in a list (TTL one hour) and its last amount in a value (TTL
    1 ms: gone by the next batch); a processing-time timer 1 ms ahead reports the session
    in the next batch, idle or not."""

    pandas = True
    SCHEMA = "part int, user string, kind string, n bigint, recent boolean, total bigint"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.amounts = handle.getListState("amounts", "amount bigint", HOUR_MS)
        self.recent = handle.getValueState("recent", "amount bigint", 1)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        recent_before = self.recent.exists()
        amounts = [int(r["amount"]) for r in _records(rows, self.pandas)]
        self.amounts.appendList([(a,) for a in amounts])
        self.recent.update((amounts[-1],))
        total = sum(a for (a,) in self.amounts.get())
        n = len(list(self.amounts.get()))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield from _emit(
            self.pandas,
            [
                dict(
                    part=int(key[0]),
                    user=_user(key),
                    kind="rows",
                    n=n,
                    recent=recent_before,
                    total=total,
                )
            ],
        )

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        n = len(list(self.amounts.get()))
        if n >= 4:
            self.amounts.clear()
        yield from _emit(
            self.pandas,
            [
                dict(
                    part=int(key[0]),
                    user=_user(key),
                    kind="timer",
                    n=n,
                    recent=self.recent.exists(),
                    total=None,
                )
            ],
        )

    def close(self) -> None:
        pass


class RowSessionTracker(SessionTracker):
    pandas = False


# --- a per-key map of counters -------------------------------------------------------------


class Counters(StatefulProcessor):
    """A map of counters per key by ``amount % 3``; a bucket reaching 3 is removed
    (``removeKey``), an amount of 0 empties the map first (``clear``); the output is every
    touched bucket and the map's size."""

    pandas = True
    SCHEMA = "part int, user string, bucket int, n bigint, size int, has_zero boolean"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.counts = handle.getMapState("counts", "bucket int", "n bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        records = _records(rows, self.pandas)
        if any(int(r["amount"]) == 0 for r in records):
            self.counts.clear()
        touched: dict[int, int] = {}
        for r in records:
            bucket = int(r["amount"]) % 3
            current = touched.get(bucket)
            if current is None:
                found = self.counts.getValue((bucket,))
                current = 0 if found is None else found[0]
            touched[bucket] = current + 1
        for bucket, n in touched.items():
            if n >= 3:
                self.counts.removeKey((bucket,))
            else:
                self.counts.updateValue((bucket,), (n,))
        size = len(list(self.counts.keys()))
        assert len(list(self.counts.values())) == size == len(list(self.counts.iterator()))
        has_zero = self.counts.containsKey((0,))
        out = [
            dict(part=int(key[0]), user=_user(key), bucket=b, n=n, size=size, has_zero=has_zero)
            for b, n in sorted(touched.items())
        ]
        yield from _emit(self.pandas, out)


class RowCounters(Counters):
    pandas = False


# --- a fraud-style detector with event-time timers -----------------------------------------


class FraudDetector(StatefulProcessor):
    """An amount of 7 or more opens a 3-second window (an event-time timer; one per key at a
    time); the window's amounts add up; when the watermark passes the window's end an alert
    reports the total. An amount of 0 cancels every pending window of the key. Rows without
    a time are skipped (before sorting: the Row form's ``None`` does not compare with an int,
    the pandas form's ``nan`` with nothing)."""

    pandas = True
    SCHEMA = "part int, user string, kind string, at bigint, total bigint"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.total = handle.getValueState("total", "total bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        out = []
        timed = [r for r in _records(rows, self.pandas) if not pd.isna(r["ts_ms"])]
        for r in sorted(timed, key=lambda r: (int(r["ts_ms"]), int(r["amount"]))):
            amount, at = int(r["amount"]), int(r["ts_ms"])
            pending = list(self.handle.listTimers())
            if amount == 0:
                for t in pending:
                    self.handle.deleteTimer(t)
                self.total.clear()
            elif pending:
                (total,) = self.total.get() or (0,)
                self.total.update((total + amount,))
            elif amount >= 7:
                self.handle.registerTimer(int(at) + 3000)
                self.total.update((amount,))
                out.append(
                    dict(part=int(key[0]), user=_user(key), kind="open", at=int(at), total=amount)
                )
        yield from _emit(self.pandas, out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        (total,) = self.total.get() or (0,)
        self.total.clear()
        at = expiredTimerInfo.getExpiryTimeInMs()
        yield from _emit(
            self.pandas, [dict(part=int(key[0]), user=_user(key), kind="alert", at=at, total=total)]
        )


class RowFraudDetector(FraudDetector):
    pandas = False


# --- a processor with initial state ----------------------------------------------------------


class Totals(StatefulProcessor):
    """A running total per key, starting from the initial state's ``total``."""

    pandas = True
    SCHEMA = "part int, user string, total bigint, seeded boolean"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.total = handle.getValueState("total", "total bigint")
        self.seeded = handle.getValueState("seeded", "seeded boolean")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        rows = [initialState] if not self.pandas else initialState.to_dict("records")
        for r in rows:
            (total,) = self.total.get() or (0,)
            self.total.update((total + int(r["total"]),))
        self.seeded.update((True,))

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        (total,) = self.total.get() or (0,)
        total += sum(int(r["amount"]) for r in _records(rows, self.pandas))
        self.total.update((total,))
        seeded = self.seeded.exists()
        yield from _emit(
            self.pandas, [dict(part=int(key[0]), user=_user(key), total=total, seeded=seeded)]
        )


class RowTotals(Totals):
    pandas = False


INITIAL = [(0, "a", 100), (0, "b", 5), (0, "b", 6), (0, "z", 1)]
"""Initial totals: ``b`` has two rows, ``z`` never has input."""


def _initial(df: DataFrame) -> DataFrame:
    return df.sparkSession.createDataFrame(INITIAL, "part int, user string, total bigint")


# --- a processor whose state variables change between runs -------------------------------


class Evolving(StatefulProcessor):
    """One processor class as its code changes between runs of one query (``stage``):

    - ``v1``: a count (value ``n bigint``) and the amounts seen (a list);
    - ``v2``: the count gains a nullable field ``note`` (older values read it as null) and a
      new variable ``last`` (value) appears;
    - ``v3``: the count's ``note`` is dropped, the list ``seen`` is no longer declared;
    - ``v4``: as v3, and ``init`` deletes ``seen`` (``deleteIfExists``, undeclared);
    - ``v5``: ``seen`` declared again after ``v4`` deleted it, and ``last`` deleted and
      declared again by every ``init`` (each batch reads it empty);
    - ``retyped``: the count's ``n`` becomes a string: refused before any batch runs.

    The output shows what each key read: the count, its note, the list's length (-1 without
    the list) and the last amount (-1 without ``last``)."""

    pandas = False
    SCHEMA = "part int, user string, n bigint, note string, seen bigint, last bigint"
    ENCODING = "avro"  # Spark evolves a variable's schema only with Avro-encoded state

    def __init__(self, stage: str = "v1") -> None:
        self.stage = stage

    def init(self, handle: StatefulProcessorHandle) -> None:
        stage = self.stage
        if stage == "v4":
            handle.deleteIfExists("seen")
        if stage == "v5":
            handle.deleteIfExists("last")
        self.fields = {"v2": "n bigint, note string", "retyped": "n string"}.get(stage, "n bigint")
        self.count = handle.getValueState("count", self.fields)
        declares_seen = stage in ("v1", "v2", "v5")
        self.seen = handle.getListState("seen", "amount bigint") if declares_seen else None
        self.last = handle.getValueState("last", "amount bigint") if stage != "v1" else None

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        amounts = [int(r["amount"]) for r in _records(rows, self.pandas)]
        stored = self.count.get()
        n = (0 if stored is None else int(stored[0])) + len(amounts)
        note = stored[1] if stored is not None and len(stored) > 1 else None
        self.count.update((n, self.stage) if "note" in self.fields else (n,))
        seen = last = -1
        if self.seen is not None:
            self.seen.appendList([(a,) for a in amounts])
            seen = len(list(self.seen.get()))
        if self.last is not None:
            (last,) = self.last.get() or (-1,)
            self.last.update((amounts[-1],))
        yield from _emit(
            self.pandas,
            [dict(part=int(key[0]), user=_user(key), n=n, note=note, seen=seen, last=last)],
        )


class PandasEvolving(Evolving):
    """:class:`Evolving` in the pandas form."""

    pandas = True


RESHAPED_FIELDS = {
    "bigint": "n bigint",
    "renamed": "total bigint",
    "renamed-int": "total int",
    "added": "n int, note string",
}
""":class:`Reshaped`'s count by stage (``n int`` in the first)."""


class Reshaped(StatefulProcessor):
    """A count whose declared fields change between runs of one query (``stage``), for
    Spark's outcome of each schema change on restart: ``int`` (``n int``), ``bigint`` (``n``
    widened), ``renamed`` (``n`` renamed and widened: ``total bigint``), ``renamed-int``
    (``n`` renamed ``total``, still ``int``), ``added`` (a nullable ``note`` added).
    The output is what the key read (``n`` before this batch's rows, -1 without a value) and
    the count after them."""

    pandas = False
    SCHEMA = "part int, user string, read bigint, note string, n bigint"
    ENCODING = "avro"

    def __init__(self, stage: str = "int") -> None:
        self.stage = stage

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.fields = RESHAPED_FIELDS.get(self.stage, "n int")
        self.count = handle.getValueState("count", self.fields)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        stored = self.count.get()
        read = -1 if stored is None else stored[0]
        note = stored[1] if stored is not None and len(stored) > 1 else None
        n = (read if read is not None and read >= 0 else 0) + len(_records(rows, self.pandas))
        self.count.update((n, self.stage) if "note" in self.fields else (n,))
        yield from _emit(
            self.pandas, [dict(part=int(key[0]), user=_user(key), read=read, note=note, n=n)]
        )


class UnsafeReshaped(Reshaped):
    """:class:`Reshaped` with Spark's default encoding of state rows (``UnsafeRow``)."""

    ENCODING = "unsaferow"


class Rekeyed(StatefulProcessor):
    """A count per key in a variable ``counts`` whose key schema changes between runs of one
    query (``stage``): a map with the user key ``k int`` (``int``), ``k bigint`` (``bigint``),
    ``k string`` (``string``), or a value (``value``: no user key). The output is the count."""

    pandas = False
    SCHEMA = "part int, user string, n bigint"
    ENCODING = "avro"

    def __init__(self, stage: str = "int") -> None:
        self.stage = stage

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.stage == "value":
            self.count = handle.getValueState("counts", "n bigint")
        else:
            self.counts = handle.getMapState("counts", f"k {self.stage}", "n bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        n = len(_records(rows, self.pandas))
        if self.stage == "value":
            (before,) = self.count.get() or (0,)
            self.count.update((before + n,))
        else:
            k = ("0",) if self.stage == "string" else (0,)
            (before,) = self.counts.getValue(k) or (0,)
            self.counts.updateValue(k, (before + n,))
        yield from _emit(self.pandas, [dict(part=int(key[0]), user=_user(key), n=before + n)])


class UnsafeRekeyed(Rekeyed):
    """:class:`Rekeyed` with Spark's default encoding of state rows (``UnsafeRow``)."""

    ENCODING = "unsaferow"


class KeyEcho(StatefulProcessor):
    """Outputs the ``repr`` of the user key it is handed (pandas form): Spark's
    ``transformWithStateInPandas`` hands a null string key as ``nan``, its Row form ``None``."""

    pandas = True
    SCHEMA = "user_key string"

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        yield from _emit(self.pandas, [dict(user_key=repr(key[1]))])


class KeyCount(StatefulProcessor):
    """A running count of each key's rows, output with the ``repr`` of the key's last column
    as it is handed (pandas form): ours hands a null timestamp key as ``NaT`` and keeps its
    state; Spark's worker fails setting it (:func:`time_key_operator`)."""

    pandas = True
    SCHEMA = "key string, n bigint"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        (n,) = self.count.get() or (0,)
        n += len(_records(rows, self.pandas))
        self.count.update((n,))
        yield from _emit(self.pandas, [dict(key=repr(key[-1]), n=n)])


# --- the harness's entries -------------------------------------------------------------------


# --- map state with a TTL ------------------------------------------------------------------


class RowExpiringMap(StatefulProcessor):
    """Two maps of a key's amounts by ``amount % 3``, TTL 1 ms (``short``: gone by the next
    batch) and one hour (``long``); outputs how many entries each has after the key's rows."""

    pandas = False
    SCHEMA = "part int, user string, short bigint, long bigint"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.short = handle.getMapState("short", "bucket int", "amount bigint", 1)
        self.long = handle.getMapState("long", "bucket int", "amount bigint", HOUR_MS)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        for r in _records(rows, self.pandas):
            bucket = (int(r["amount"]) % 3,)
            self.short.updateValue(bucket, (int(r["amount"]),))
            self.long.updateValue(bucket, (int(r["amount"]),))
        counts = dict(short=len(list(self.short.keys())), long=len(list(self.long.keys())))
        yield from _emit(self.pandas, [dict(part=int(key[0]), user=_user(key), **counts)])

    def close(self) -> None:
        pass


def session_tracker_batches(
    spark: SparkSession, root: str, query_id: str, catalog_url: str
) -> None:
    """Two batches of user ``a`` (amounts 1 and 2, then 3; batch times 1 s and 2 s) through
    :class:`RowSessionTracker` (processing time) at ``root``: a list, a value and timers, for
    the tests that read one store of a ``transform_with_state`` operator."""
    op = transform_with_state(
        0, ["part", "user"], KEY, RowSessionTracker(), RowSessionTracker.SCHEMA, 1,
        time_mode="ProcessingTime", pandas=False,
    )  # fmt: skip
    query = StatefulQuery(query_id, root, [op], catalog_url=catalog_url)
    for batch_id, amounts in enumerate([[1, 2], [3]]):
        df = spark.createDataFrame([(0, "a", a) for a in amounts], f"{KEY}, amount bigint")
        query.run_batch(df, batch_id, batch_time_ms=1_000 * (batch_id + 1)).release()


def _rows(rows: list[Any]) -> Rows:
    return sorted((tuple(r) for r in rows), key=repr)


def spark_null_key_as_ours(rows: Rows) -> Rows:
    """Spark's output rows with the one documented difference on null keys undone: Spark's
    pandas form hands a timer of a null ``user`` key to ``handleExpiredTimer`` as the string
    ``"NaN"`` (its worker set the implicit key from the frame's float ``nan``; the JVM keeps
    the key's state and timers under ``"NaN"``), ours as ``None``. Only for streams without
    a real ``"NaN"`` user (the generated ones), where a ``"NaN"`` can only be that key."""
    return sorted(((r[0], None, *r[2:]) if r[1] == "NaN" else r for r in rows), key=repr)


def tws_operator(
    name: str,
    processor: type[StatefulProcessor],
    time_mode: str,
    *args: Any,
    output_mode: str = "Update",
) -> Operator:
    """An :class:`Operator` running ``processor(*args)`` through our ``transform_with_state``
    and Spark's ``transformWithStateInPandas``/``transformWithState`` (RocksDB, with the
    class's ``ENCODING`` of state rows if it has one), in ``output_mode`` on both (the
    stream's mode is for the other operators)."""
    pandas = bool(processor.pandas)  # type: ignore[attr-defined]
    schema = processor.SCHEMA  # type: ignore[attr-defined]
    seeded = issubclass(processor, Totals)
    event_time = time_mode == "EventTime"

    def ours(s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
        active = SparkSession.getActiveSession()
        initial = _initial(active.range(1)) if seeded and active is not None else None
        op = transform_with_state(
            0, ["part", "user"], KEY, processor(*args), schema, 2,
            time_mode=time_mode, pandas=pandas, initial_state=initial, output_mode=output_mode,
        )  # fmt: skip
        mark = Watermark("ts", timedelta(seconds=s.delay_s)) if event_time else None
        return [op], mark

    def spark(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
        conf = df.sparkSession.conf
        conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        if hasattr(processor, "ENCODING"):
            conf.set("spark.sql.streaming.stateStore.encodingFormat", processor.ENCODING)
        if event_time:
            df = df.withWatermark("ts", f"{s.delay_s} seconds")
        grouped = df.groupBy("part", "user")
        kwargs: dict[str, Any] = {}
        if seeded:
            kwargs["initialState"] = _initial(df).groupBy("part", "user")
        method = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
        plan = method(processor(*args), schema, output_mode, time_mode, **kwargs)
        return plan, output_mode.lower()

    def prepare(df: DataFrame, _s: Stream) -> DataFrame:
        return df.withColumn("ts_ms", F.unix_millis("ts"))

    return Operator(name, ours, spark, _rows, prepare=prepare)


def time_key_operator() -> Operator:
    """:class:`KeyCount` keyed by ``(part, ts)``, a timestamp key, through our
    ``transform_with_state`` and Spark's ``transformWithStateInPandas`` (RocksDB)."""

    def ours(_s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
        key = "part int, ts timestamp"
        op = transform_with_state(0, ["part", "ts"], key, KeyCount(), KeyCount.SCHEMA, 2)
        return [op], None

    def spark(df: DataFrame, _s: Stream) -> tuple[DataFrame, str]:
        df.sparkSession.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        grouped = df.groupBy("part", "ts")
        return grouped.transformWithStateInPandas(
            KeyCount(), KeyCount.SCHEMA, "Update", "None"
        ), "update"

    return Operator("KeyCount", ours, spark, _rows)


TIME_MODES = {
    "SessionTracker": "ProcessingTime",
    "Counters": "None",
    "FraudDetector": "EventTime",
    "Totals": "None",
}
"""Each processor's time mode (its Row form, ``Row<name>``, has the same)."""


def tws_operator_named(name: str) -> Operator:
    """:func:`tws_operator` of a processor class of this module, by its name (for a new
    driver process: :mod:`.resume`)."""
    processor = globals()[name]
    return tws_operator(name, processor, TIME_MODES[name.removeprefix("Row")])
