"""The differential harness: one generated event stream through our operators and through
Spark's own streaming engine, compared batch by batch (see /work/shared/spark-oracle.md).

Each batch is one JSON file in an inbox; Spark reads the inbox with ``maxFilesPerTrigger=1``
and ``foreachBatch`` collects each batch's rows (into a file per batch: on Spark Connect the
function runs in a Python process of the server); our query runs the same file as the same
batch id. Times are written as naive wall-clock strings, so both sides parse them in the session
time zone the stream was generated with. Extra no-data batches are off on Spark's side (ours
has none). A stream may stop and restart both sides at a batch: Spark from its checkpoint, ours
as a new query object on the same checkpoint root and catalog, in this driver process or
(``ours_until`` and :mod:`.resume`) in a new one. Several generated streams run as one query,
told apart by a ``part`` key column (:func:`packed`).
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.runtime import (
    Agg,
    GroupState,
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
from state_runtime.runtime.times import datetime_ms

EVENTS = "part int, user string, ts timestamp, amount bigint"
EPOCH_S = 1_700_000_000  # the streams' times start here (2023-11-14)
ZONES = ("UTC", "America/Los_Angeles", "Asia/Kolkata", "Europe/Paris")
GAP_MS = 3000  # the timeout operator's session gap
ROW_GAP = (
    "CASE WHEN amount = 0 THEN NULL WHEN amount = 9 THEN 'interval 1 minute 0.5 seconds' "
    "ELSE concat(amount % 4 * 2, ' seconds') END"
)
"""The per-row session gap of a stream with ``row_gaps`` (a string, as Spark's examples):
0, 2, 4, 6 or 60.5 s, or null."""
Event = tuple[int, str | None, int | None, int]
"""(part, user, event time in ms since the epoch or None, amount): ``part`` tells apart the
independent streams packed into one query where Spark's semantics allow it (no watermark)."""
Rows = list[tuple[Any, ...]]
TIMES: dict[str, float] = {"ours": 0.0, "spark": 0.0, "resume": 0.0}

CONNECT_BACK = "Python worker failed to connect back"
"""Spark's error when a Python worker it started misses its fixed 10 s wait to connect back
(``PythonWorkerFactory.createSimpleWorker``, pyspark 4.3; no setting raises it): under load,
e.g. the driver's worker that runs a ``transformWithState`` processor's ``init`` before the
first batch of each run, or on Connect the server's ``foreachBatch`` worker at ``start()``.
Not a divergence: Spark's query is started again from its checkpoint (the failed batch was
not committed)."""
CONNECT_BACK_ATTEMPTS = 3


@dataclass(frozen=True)
class Stream:
    """One generated case: the batches, the operator's variant and the restart point."""

    batches: list[list[Event]]
    zone: str
    delay_s: int
    size_s: int
    slide_s: int
    mode: str
    restart_at: int | None
    row_gaps: bool = False
    """Session windows: each row's gap from :data:`ROW_GAP` (else a static ``size_s``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    """Out-of-order, late and duplicated rows, null times and keys, rows exactly at the
    watermark, empty batches, watermark jumps, several zones, restarts anywhere."""
    delay_s = draw(st.sampled_from([0, 2, 5]))
    size_s = draw(st.sampled_from([4, 10]))
    batches: list[list[Event]] = []
    high = 0  # the largest time so far (ms after EPOCH_S)
    for _ in range(draw(st.integers(1, 6))):
        events: list[Event] = []
        for _ in range(draw(st.integers(0, 6))):
            user = draw(st.sampled_from(["a", "b", "c", None]))
            kind = draw(st.sampled_from(["near", "near", "near", "late", "edge", "null", "jump"]))
            if kind == "null":
                at = None
            elif kind == "jump":
                at = high + draw(st.integers(10, 60)) * 1000
            elif kind == "edge":  # exactly at the watermark, or a window's end
                at = max(0, high - delay_s * 1000 - draw(st.sampled_from([0, 1])))
            elif kind == "late":
                at = max(0, high - draw(st.integers(5, 30)) * 1000)
            else:
                at = max(0, high + draw(st.integers(-4000, 4000)))
            amount = draw(st.integers(0, 9))
            events.append((0, user, None if at is None else EPOCH_S * 1000 + at, amount))
            if at is not None:
                high = max(high, at)
        if events and draw(st.booleans()):
            events.append(draw(st.sampled_from(events)))  # a duplicate row
        batches.append(events)
    restart = draw(st.none() | st.integers(1, max(1, len(batches) - 1)))
    return Stream(
        batches,
        draw(st.sampled_from(ZONES)),
        delay_s,
        size_s,
        draw(st.sampled_from([size_s, size_s // 2])),
        draw(st.sampled_from(["update", "append"])),
        restart if restart is not None and restart < len(batches) else None,
        draw(st.booleans()),
    )


def packed(count: int) -> st.SearchStrategy[Stream]:
    """``count`` streams as one query (batch ``i`` of each in batch ``i``, ``part`` set and
    among every operator's keys), with the first one's zone, delay, window, mode and restart:
    one Spark query and one of ours for ``count`` streams, since starting a query and running
    a batch cost far more than rows do. Without a watermark (the running aggregation) the
    streams are independent; with one they share it, as keys of one stream do."""

    def pack(parts: list[Stream]) -> Stream:
        length = max(len(p.batches) for p in parts)
        batches = [
            [(k, *e[1:]) for k, p in enumerate(parts) if i < len(p.batches) for e in p.batches[i]]
            for i in range(length)
        ]
        restart = parts[0].restart_at
        return replace(parts[0], batches=batches, restart_at=restart)

    return st.lists(streams(), min_size=count, max_size=count).map(pack)


def _line(event: Event, zone: str) -> str:
    part, user, at, amount = event
    ts = None
    if at is not None:
        local = datetime.fromtimestamp(at // 1000, tz=UTC).astimezone(ZoneInfo(zone))
        ts = local.replace(tzinfo=None).isoformat() + f".{at % 1000:03d}"
    return json.dumps({"part": part, "user": user, "ts": ts, "amount": amount})


# --- the operators, each as (our operators, Spark's plan on the stream, output rows) -------


def _window(s: Stream) -> Window:
    return Window(timedelta(seconds=s.size_s), timedelta(seconds=s.slide_s))


def _window_rows(rows: list[Any]) -> Rows:
    return sorted(
        ((r.part, r.user, r.window.start, r.window.end, r.n, r.total) for r in rows), key=repr
    )


def _session_rows(rows: list[Any]) -> Rows:
    return sorted(
        ((r.part, r.user, *r.session_window, r.n, r.total, r.low, r.high) for r in rows),
        key=repr,
    )


def _agg_rows(rows: list[Any]) -> Rows:
    return sorted(((r.part, r.user, r.n, r.total) for r in rows), key=repr)


def _timeout_rows(rows: list[Any]) -> Rows:
    return sorted(((r.part, r.user, r.n, r.last, r.closed) for r in rows), key=repr)


def _session_step(n: int, last: int, times_ms: list[int | None]) -> tuple[int, int]:
    """The timeout operator's function, shared by both sides: rows seen and the latest
    non-null event time (ms; -1 before any)."""
    seen = [t for t in times_ms if t is not None]
    return n + len(times_ms), max([last, *seen])


def _ours_timeouts(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState) -> Any:
    if state.has_timed_out:
        n, last = state.get() or (0, -1)
        return [(*key, n, last, True)]
    n, last = state.get() or (0, -1)
    times = [None if r[2] is None else datetime_ms(r[2], "UTC") for r in rows]
    n, last = _session_step(n, last, times)
    state.update((n, last))
    if last >= 0:
        at = max(last + GAP_MS, state.watermark_ms or 0)
        state.set_timeout_timestamp(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at))
    return [(*key, n, last, False)]


def _timeout_frame(key: tuple[Any, ...], n: int, last: int, closed: bool) -> Any:
    import pandas as pd

    return pd.DataFrame(
        {"part": [key[0]], "user": [key[1]], "n": [n], "last": [last], "closed": [closed]}
    )


def _spark_timeouts(key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
    import pandas as pd

    if state.hasTimedOut:
        n, last = state.get
        state.remove()
        yield _timeout_frame(key, n, last, True)
        return
    n, last = state.get if state.exists else (0, -1)
    for frame in frames:
        # pandas sees naive wall times of the session zone; the plan adds exact epoch ms.
        times = [None if pd.isna(t) else int(t) for t in frame["ts_ms"]]
        n, last = _session_step(n, last, times)
    state.update((n, last))
    if last >= 0:
        state.setTimeoutTimestamp(max(last + GAP_MS, state.getCurrentWatermarkMs()))
    yield _timeout_frame(key, n, last, False)


@dataclass(frozen=True)
class Operator:
    """Our operators for a stream, Spark's plan on the stream, the output as comparable rows,
    and how many independent streams one query may carry."""

    name: str
    ours: Callable[[Stream], tuple[list[StatefulOperator], Watermark | None]]
    spark: Callable[[DataFrame, Stream], tuple[DataFrame, str]]
    rows: Callable[[list[Any]], Rows]
    pack: int = 1
    prepare: Callable[[DataFrame, Stream], DataFrame] = lambda df, _s: df
    """The input as both engines get it (columns the operator needs, derived the same way)."""


def _ours_windows(s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
    aggs = [Agg("n", "count"), Agg("total", "sum", "amount")]
    op = windowed_aggregation(
        0, ["part", "user"], "part int, user string", "ts", _window(s), aggs, 2,
        output_mode=s.mode,  # type: ignore[arg-type]
    )  # fmt: skip
    return [op], Watermark("ts", timedelta(seconds=s.delay_s))


def _spark_windows(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
    out = (
        df.withWatermark("ts", f"{s.delay_s} seconds")
        .groupBy("part", "user", F.window("ts", f"{s.size_s} seconds", f"{s.slide_s} seconds"))
        .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
    )
    return out, s.mode


def _session_input(df: DataFrame, s: Stream) -> DataFrame:
    return df.withColumn("gap", F.expr(ROW_GAP)) if s.row_gaps else df


def _session_aggs() -> list[Agg]:
    return [
        Agg("n", "count"),
        Agg("total", "sum", "amount"),
        Agg("low", "min", "user", "string"),
        Agg("high", "max", "amount"),
    ]


def _ours_session_windows(s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
    gap = SessionWindow("gap" if s.row_gaps else timedelta(seconds=s.size_s))
    op = session_window_aggregation(
        0, ["part", "user"], "part int, user string", "ts", gap, _session_aggs(), 2
    )
    return [op], Watermark("ts", timedelta(seconds=s.delay_s))


def _spark_session_windows(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
    gap = F.col("gap") if s.row_gaps else f"{s.size_s} seconds"
    out = (
        df.withWatermark("ts", f"{s.delay_s} seconds")
        .groupBy("part", "user", F.session_window("ts", gap))
        .agg(
            F.count("*").alias("n"),
            F.sum("amount").alias("total"),
            F.min("user").alias("low"),
            F.max("amount").alias("high"),
        )
    )
    return out, "append"


def _ours_running(s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
    aggs = [Agg("n", "count"), Agg("total", "sum", "amount")]
    return [running_aggregation(0, ["part", "user"], "part int, user string", aggs, 2)], None


def _spark_running(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
    out = df.groupBy("part", "user").agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
    return out, "update"


def _ours_sessions(s: Stream) -> tuple[list[StatefulOperator], Watermark | None]:
    op = map_groups_with_state(
        0, ["part", "user"], "part int, user string", "n bigint, last bigint",
        "part int, user string, n bigint, last bigint, closed boolean", _ours_timeouts, 2,
        timeout="event_time", event_time_column="ts",
    )  # fmt: skip
    return [op], Watermark("ts", timedelta(seconds=s.delay_s))


def _spark_sessions(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
    from pyspark.sql.streaming.state import GroupStateTimeout

    out = (
        df.withWatermark("ts", f"{s.delay_s} seconds")
        .withColumn("ts_ms", F.unix_millis("ts"))
        .groupBy("part", "user")
        .applyInPandasWithState(
            _spark_timeouts,
            "part int, user string, n long, last long, closed boolean",
            "n long, last long",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )
    )
    return out, "update"


def _ours_dedup(within: bool) -> Callable[[Stream], tuple[list[StatefulOperator], Watermark]]:
    def build(s: Stream) -> tuple[list[StatefulOperator], Watermark]:
        mark = Watermark("ts", timedelta(seconds=s.delay_s))
        columns = ["part", "user"] if within else ["part", "user", "ts"]
        op = drop_duplicates(0, columns, EVENTS, mark, 2, within_watermark=within)
        return [op], mark

    return build


def _spark_dedup(within: bool) -> Callable[[DataFrame, Stream], tuple[DataFrame, str]]:
    def plan(df: DataFrame, s: Stream) -> tuple[DataFrame, str]:
        marked = df.withWatermark("ts", f"{s.delay_s} seconds")
        if within:
            return marked.dropDuplicatesWithinWatermark(["part", "user"]), "append"
        return marked.dropDuplicates(["part", "user", "ts"]), "append"

    return plan


def _dedup_rows(columns: tuple[str, ...]) -> Callable[[list[Any]], Rows]:
    """The rows that passed, by their key columns (which of a batch's rows of one key passes
    is the engine's row order, not part of the contract)."""
    return lambda rows: sorted((tuple(r[c] for c in columns) for r in rows), key=repr)


PACK = 5
"""Streams per query for the operators with a watermark (they share the query's watermark)."""
OPERATORS = {
    "running_aggregation": Operator(
        "running_aggregation", _ours_running, _spark_running, _agg_rows, pack=10
    ),
    "windowed_aggregation": Operator(
        "windowed_aggregation", _ours_windows, _spark_windows, _window_rows, pack=PACK
    ),
    "session_windows": Operator(
        "session_windows",
        _ours_session_windows,
        _spark_session_windows,
        _session_rows,
        pack=PACK,
        prepare=_session_input,
    ),
    "event_time_timeouts": Operator(
        "event_time_timeouts", _ours_sessions, _spark_sessions, _timeout_rows, pack=PACK
    ),
    "drop_duplicates": Operator(
        "drop_duplicates",
        _ours_dedup(False),
        _spark_dedup(False),
        _dedup_rows(("part", "user", "ts")),
        pack=PACK,
    ),
    "drop_duplicates_within_watermark": Operator(
        "drop_duplicates_within_watermark",
        _ours_dedup(True),
        _spark_dedup(True),
        _dedup_rows(("part", "user")),
        pack=PACK,
    ),
}


# --- running one stream through both ---------------------------------------------------


@dataclass
class Divergence(AssertionError):
    operator: str
    batch_id: int
    stream: Stream
    ours: Rows
    theirs: Rows

    def __str__(self) -> str:
        return (
            f"{self.operator} diverges from Spark at batch {self.batch_id}\n"
            f"  ours:   {self.ours}\n  spark:  {self.theirs}\n  stream: {self.stream.to_json()}"
        )


@dataclass
class Outcome:
    """Each engine's output rows per batch of one stream."""

    operator: Operator
    stream: Stream
    ours: dict[int, Rows] = field(default_factory=dict)
    theirs: dict[int, Rows] = field(default_factory=dict)

    def check(self) -> int:
        """Raise :class:`Divergence` at the first batch whose outputs differ; the number of
        batches compared."""
        for batch_id in range(len(self.stream.batches)):
            ours, theirs = self.ours.get(batch_id), self.theirs.get(batch_id)
            if ours != theirs:
                raise Divergence(
                    self.operator.name, batch_id, self.stream, ours or [], theirs or []
                )
        return len(self.stream.batches)


def session_for(spark: SparkSession, stream: Stream) -> SparkSession:
    """A session of the stream's time zone, without Spark's extra no-data batches."""
    session = spark.newSession()
    for conf, value in (
        ("spark.sql.streaming.noDataMicroBatches.enabled", "false"),
        ("spark.sql.shuffle.partitions", "2"),
        ("spark.sql.session.timeZone", stream.zone),
    ):
        session.conf.set(conf, value)
    return session


def _file(folder: Path, batch_id: int) -> Path:
    return folder / "in" / f"{batch_id:04d}.json"


def run_ours(
    session: SparkSession,
    operator: Operator,
    stream: Stream,
    folder: Path,
    catalog_url: str,
    batches: range,
) -> dict[int, Rows]:
    """Our query, a new object on the stream's checkpoint root and catalog, on ``batches``
    (their files exist)."""
    started = time.perf_counter()
    ops, watermark = operator.ours(stream)
    query = StatefulQuery(
        "diff", str(folder / "ckpt"), ops, catalog_url=catalog_url, watermark=watermark,
        parallelism=2,
    )  # fmt: skip
    out: dict[int, Rows] = {}
    for batch_id in batches:
        df = session.read.schema(EVENTS).json(str(_file(folder, batch_id)))
        result = query.run_batch(operator.prepare(df, stream), batch_id)
        out[batch_id] = operator.rows(result.output.collect())
        result.release()
    TIMES["ours"] += time.perf_counter() - started
    return out


def write_batch(folder: Path, stream: Stream, batch_id: int, base: float) -> None:
    """The batch's file in the inbox, modified at ``base + batch_id`` (the file source orders
    by modification time)."""
    path = _file(folder, batch_id)
    lines = (_line(e, stream.zone) + "\n" for e in stream.batches[batch_id])
    path.write_text("".join(lines))
    os.utime(path, (base + batch_id, base + batch_id))


def run_spark(session: SparkSession, operator: Operator, folder: Path, outcome: Outcome) -> None:
    """Spark's query on the inbox from its checkpoint, until every file is read; each batch's
    rows into ``outcome.theirs`` (spilled to a file per batch: on Spark Connect
    ``foreachBatch`` runs in a Python process of the server)."""
    started = time.perf_counter()
    spilled = folder / "spark-out"
    spilled.mkdir(exist_ok=True)
    spill = str(spilled)

    def collect(df: DataFrame, batch_id: int) -> None:
        Path(spill, f"{batch_id}.pickle").write_bytes(pickle.dumps(df.collect()))

    source = session.readStream.schema(EVENTS).option("maxFilesPerTrigger", 1)
    stream = outcome.stream
    plan, mode = operator.spark(operator.prepare(source.json(str(folder / "in")), stream), stream)
    writer = (
        plan.writeStream.outputMode(mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(folder / "spark-ckpt"))
    )
    try:
        for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
            running = None
            try:  # on Connect, start() itself starts foreachBatch's worker on the server
                running = writer.start()
                running.processAllAvailable()
                break
            except Exception as e:  # StreamingQueryException, or Connect's SparkException
                if CONNECT_BACK not in str(e) or attempt == CONNECT_BACK_ATTEMPTS:
                    raise
            finally:
                if running is not None:
                    running.stop()
    finally:
        for path in spilled.glob("*.pickle"):
            outcome.theirs[int(path.stem)] = operator.rows(pickle.loads(path.read_bytes()))
        TIMES["spark"] += time.perf_counter() - started


def run_stream(
    spark: SparkSession,
    operator: Operator | Sequence[Operator],
    stream: Stream,
    folder: Path,
    catalog_url: str,
    *,
    ours_until: int | None = None,
    restarts: Sequence[int] | None = None,
) -> Outcome:
    """Run ``stream`` through both engines, stopping and restarting both at its restart
    point: Spark from its checkpoint, ours as a new query object. With ``ours_until``, our
    side stops before that batch (another driver process runs the rest: :mod:`.resume`).
    ``restarts`` (else the stream's restart point) may be several, with one operator per run
    (the code of a query changed between runs)."""
    session = session_for(spark, stream)
    (folder / "in").mkdir(parents=True)
    base = time.time() - 1000
    if restarts is None:
        restarts = [stream.restart_at] if stream.restart_at is not None else []
    runs = [operator] * (len(restarts) + 1) if isinstance(operator, Operator) else operator
    if len(runs) != len(restarts) + 1:
        raise ValueError(f"{len(runs)} operators for {len(restarts) + 1} runs")
    outcome = Outcome(runs[0], stream)
    bounds = zip([0, *restarts], [*restarts, len(stream.batches)], strict=True)
    for run, (first, end) in zip(runs, bounds, strict=True):
        for batch_id in range(first, end):
            write_batch(folder, stream, batch_id, base)
        mine = range(first, end if ours_until is None else min(end, ours_until))
        if mine:
            outcome.ours.update(run_ours(session, run, stream, folder, catalog_url, mine))
        run_spark(session, run, folder, outcome)
    return outcome


def next_batch(
    spark: SparkSession, operator: Operator, stream: Stream, folder: Path, catalog_url: str,
    outcome: Outcome, batch_id: int,
) -> tuple[Callable[[], None], Callable[[], None]]:  # fmt: skip
    """Batch ``batch_id`` of ``stream`` written to the inbox, and the runs of it by
    ``operator`` on our engine and on Spark's (each adds its rows to ``outcome``): for a test
    that goes on from :func:`run_stream`'s batches, or expects an engine to refuse."""
    (folder / "in").mkdir(parents=True, exist_ok=True)
    write_batch(folder, stream, batch_id, time.time())
    session = session_for(spark, stream)
    mine = range(batch_id, batch_id + 1)

    def ours() -> None:
        outcome.ours.update(run_ours(session, operator, stream, folder, catalog_url, mine))

    return ours, partial(run_spark, session, operator, folder, outcome)
