"""``transform_with_state`` against Spark's own ``transformWithStateInPandas`` and
``transformWithState`` (RocksDB), batch by batch on fixed streams, with the same processor
classes (tests/runtime/tws_processors.py), including a restart of both engines."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from state_runtime.errors import SchemaMismatch
from state_runtime.runtime import StatefulQuery, read_state, transform_with_state
from state_runtime.runtime.spark_kind import is_connect

from .differential import (
    EPOCH_S,
    Event,
    Stream,
    next_batch,
    run_stream,
)
from .resume import Resume, resume_elsewhere
from .tws_processors import (
    Counters,
    Evolving,
    FraudDetector,
    KeyEcho,
    PandasEvolving,
    Rekeyed,
    Reshaped,
    RowCounters,
    RowExpiringMap,
    RowFraudDetector,
    RowSessionTracker,
    RowTotals,
    SessionTracker,
    Totals,
    UnsafeRekeyed,
    UnsafeReshaped,
    tws_operator,
    tws_operator_named,
)

pytestmark = pytest.mark.spark

T0 = EPOCH_S * 1000


def _at(part: int, user: str | None, seconds: float | None, amount: int) -> Event:
    return (part, user, None if seconds is None else T0 + int(seconds * 1000), amount)


BATCHES: list[list[Event]] = [
    [_at(0, "a", 1, 7), _at(0, "b", 1, 7), _at(0, "a", 2, 1), _at(0, "c", 2, 3)],
    [_at(0, "a", 3, 2), _at(0, "b", 2.5, 0), _at(0, "c", 4, 9)],
    [],  # an idle batch: timers still fire
    [_at(0, "a", 9, 4), _at(0, "c", 4.5, 1), _at(0, "d", 10, 7), _at(0, "b", 10, 7)],
    [_at(0, "a", 30, 5), _at(0, "b", 12, 5), _at(0, "a", 30.5, 5)],
    [_at(0, "e", 60, 1)],
]
"""Keys a, b, c, d, e; amounts >= 7 open fraud windows; b cancels one with
a 0; c's and b's windows end at the same instant; the watermark jumps at batch 4."""


def _stream(restart_at: int | None) -> Stream:
    return Stream(BATCHES, "Europe/Paris", 2, 0, 0, "update", restart_at)


LONG = pytest.mark.skipif(
    not os.environ.get("TWS_FUZZ_STREAMS"), reason="the other form of each processor: make fuzz-tws"
)
CASES = [
    pytest.param(SessionTracker, "ProcessingTime", id="SessionTracker"),
    pytest.param(RowCounters, "None", id="RowCounters"),
    pytest.param(FraudDetector, "EventTime", id="FraudDetector"),
    pytest.param(RowTotals, "None", id="RowTotals", marks=pytest.mark.connect),
    pytest.param(RowSessionTracker, "ProcessingTime", id="RowSessionTracker", marks=LONG),
    pytest.param(Counters, "None", id="Counters", marks=LONG),
    pytest.param(RowFraudDetector, "EventTime", id="RowFraudDetector", marks=LONG),
    pytest.param(Totals, "None", id="Totals", marks=LONG),
]
"""Each processor in one form here, the other form with ``make fuzz-tws`` (a case starts two
streaming queries: the file stays short)."""


@pytest.mark.parametrize(("processor", "time_mode"), CASES)
def test_transform_with_state_equals_spark(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    processor: type[StatefulProcessor],
    time_mode: str,
) -> None:
    operator = tws_operator(processor.__name__, processor, time_mode)
    outcome = run_stream(spark, operator, _stream(3), tmp_path, sqlite_catalog_url)
    assert outcome.check() == len(BATCHES)
    if issubclass(processor, Counters):
        _the_maps_read_equal(spark, tmp_path, sqlite_catalog_url)


def _the_maps_read_equal(spark: SparkSession, folder: Path, catalog_url: str) -> None:
    """The map ``counts`` as the query left it, after ``removeKey`` (a's buckets reaching 3)
    and ``clear`` (b's 0 at batch 1): ours by ``read_state(state_variable=)``, Spark's by its
    state data source (``statestore`` with ``stateVarName``, one row per map entry)."""
    ours = read_state(
        spark, str(folder / "ckpt"), 0, catalog_url=catalog_url, state_variable="counts"
    ).collect()
    theirs = (
        spark.read.format("statestore")
        .option("path", str(folder / "spark-ckpt"))
        .option("stateVarName", "counts")
        .load()
        .collect()
    )
    mine = sorted((tuple(r.key), tuple(r.value)) for r in ours)
    spark_rows = sorted(
        ((*r.key, *r.user_map_key), tuple(r.user_map_value)) for r in theirs
    )  # fmt: skip
    assert mine == spark_rows
    # a's buckets all reached 3 (removed); b's 7 before its 0 was cleared (bucket 1 is 1)
    assert [k for k, _ in mine if k[1] == "a"] == []
    assert [(k[2], v[0]) for k, v in mine if k[1] == "b"] == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.connect
def test_a_restart_in_a_new_driver_process_continues_state_and_timers(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Our side stops after batch 2; a new driver process (its own Spark session, query
    objects, catalog connection and Python workers) runs batches 3 to 5 from the checkpoint
    root and the catalog; Spark restarts from its checkpoint: every batch's output is still
    Spark's. Value, list and map state with TTL, processing- and event-time timers. On Spark
    Connect (the connect pass; the new process is a Connect client of a server of its own)
    the session tracker alone, to keep the serial pass short: a list and a value with TTL and
    processing-time timers pending across the restart."""
    names = ["SessionTracker"]
    if not is_connect(spark):
        names += ["RowCounters", "FraudDetector"]
    stream, outcomes = _stream(3), []
    for name in names:
        outcomes.append(
            run_stream(
                spark, tws_operator_named(name), stream, tmp_path / name, sqlite_catalog_url,
                ours_until=3,
            )
        )  # fmt: skip
    jobs = [Resume(name, stream, tmp_path / name, sqlite_catalog_url, 3) for name in names]
    for outcome, rows in zip(outcomes, resume_elsewhere(jobs), strict=True):
        assert sorted(rows) == [3, 4, 5]
        outcome.ours.update(rows)
        assert outcome.check() == len(BATCHES)


@pytest.mark.connect
def test_each_variable_is_a_store_read_by_name_and_appends_write_only_new_elements(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """``read_state(state_variable=)`` and ``read_state(timers=True)`` read the stores of a
    ``transform_with_state`` operator; appending to a list of n elements writes the new
    element and the list's head, not the list."""
    op = transform_with_state(
        0, ["part", "user"], "part int, user string", SessionTracker(),
        SessionTracker.SCHEMA, 1, time_mode="ProcessingTime",
    )  # fmt: skip
    query = StatefulQuery("read", str(tmp_path / "ckpt"), [op], catalog_url=sqlite_catalog_url)
    schema = "part int, user string, amount bigint"
    for batch_id, amounts in enumerate([[1, 2], [3]]):
        df = spark.createDataFrame([(0, "a", a) for a in amounts], schema)
        result = query.run_batch(df, batch_id, batch_time_ms=1_000 * (batch_id + 1))
        result.release()
    updated = {r.info.store.store_name: r.keys_updated for r in result.reports}
    assert updated["amounts"] == 2  # the new element and the head row
    read = partial(read_state, spark, str(tmp_path / "ckpt"), 0, catalog_url=sqlite_catalog_url)
    rows = read(state_variable="amounts").collect()
    elements = sorted((r.key[2], r.value[0]) for r in rows if r.key[2] >= 0)
    assert [i for i, _ in elements] == [0, 1, 2]  # a batch's rows of a key come in no order
    assert sorted(a for _, a in elements) == [1, 2, 3]
    assert [(r.key[:2], r.value[0]) for r in read(timers=True).collect()] == [((0, "a"), 2001)]
    assert read(state_variable="recent").count() == 1


EVOLVING = [
    [_at(0, "a", 1, 1), _at(0, "b", 1, 2)],
    [_at(0, "a", 2, 3)],
    [_at(0, "a", 3, 4), _at(0, "c", 3, 5)],  # v2 from here
    [_at(0, "b", 4, 6)],
    [_at(0, "a", 5, 7), _at(0, "c", 5, 8)],  # v3 from here
    [_at(0, "b", 6, 9)],
]


@pytest.mark.parametrize(
    "processor", [Evolving, pytest.param(PandasEvolving, marks=LONG)], ids=["Row", "pandas"]
)
def test_state_variables_added_evolved_dropped_and_retyped_across_restarts(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, processor: type[Evolving]
) -> None:
    """One query, its processor's code changed at each restart (``Evolving``: v1, v2 at
    batch 2, v3 at batch 4), on both engines (Spark with Avro-encoded state): a new variable
    starts empty, a nullable field added to a variable reads as null in older values, a
    variable no longer declared is left alone; outputs equal batch by batch. Then a field's
    type changes: both refuse before running the batch (Spark's
    ``STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION``, our ``SchemaMismatch``)."""
    stream = Stream(EVOLVING, "UTC", 0, 0, 0, "update", None)
    runs = [tws_operator(f"Evolving {s}", processor, "None", s) for s in ("v1", "v2", "v3")]
    outcome = run_stream(spark, runs, stream, tmp_path, sqlite_catalog_url, restarts=[2, 4])
    assert outcome.check() == len(EVOLVING)
    assert outcome.ours[3] == [(0, "b", 2, None, 2, -1)]  # b's count, written by v1
    retyped = tws_operator("Evolving retyped", processor, "None", "retyped")
    seventh = replace(stream, batches=[*EVOLVING, [_at(0, "a", 7, 1)]])
    ours, theirs = next_batch(spark, retyped, seventh, tmp_path, sqlite_catalog_url, outcome, 6)
    with pytest.raises(SchemaMismatch, match="value field 'n': bigint -> string"):
        ours()
    with pytest.raises(StreamingQueryException, match="STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"):
        theirs()
    assert 6 not in outcome.ours and 6 not in outcome.theirs


@pytest.mark.parametrize("processor", [Evolving, PandasEvolving], ids=["Row", "pandas"])
def test_a_variable_deleted_then_declared_again_reads_empty_on_both_engines(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, processor: type[Evolving]
) -> None:
    """``deleteIfExists`` on both engines, in the Row and the pandas form (``Evolving``): v4's
    ``init`` deletes the list ``seen`` it no longer declares, v5 declares it again (it starts
    empty) and deletes and declares ``last`` again in every ``init`` (each batch reads it
    empty); outputs equal batch by batch. Then each variable as the query left it: ours by
    ``read_state(state_variable=)`` against Spark's state data source (``statestore`` with
    ``stateVarName``)."""
    stream = Stream(EVOLVING, "UTC", 0, 0, 0, "update", None)
    runs = [tws_operator(f"Evolving {s}", processor, "None", s) for s in ("v1", "v4", "v5")]
    outcome = run_stream(spark, runs, stream, tmp_path, sqlite_catalog_url, restarts=[2, 4])
    assert outcome.check() == len(EVOLVING)
    # the list holds only what v5 appended; last, deleted by every init, reads empty
    assert outcome.ours[4] == [(0, "a", 4, None, 1, -1), (0, "c", 2, None, 1, -1)]
    ours = partial(read_state, spark, str(tmp_path / "ckpt"), 0, catalog_url=sqlite_catalog_url)
    theirs = spark.read.format("statestore").option("path", str(tmp_path / "spark-ckpt"))
    seen = sorted((r.key[0], r.key[1], r.value[0]) for r in ours(state_variable="seen").collect()
                  if r.key[2] >= 0)  # fmt: skip
    spark_seen = theirs.option("stateVarName", "seen").load().collect()
    assert seen == sorted((r.key.part, r.key.user, r.list_element.amount) for r in spark_seen)
    assert seen == [(0, "a", 7), (0, "b", 9), (0, "c", 8)]
    for name in ("count", "last"):
        mine = sorted((r.key[0], r.key[1], r.value[0]) for r in ours(state_variable=name).collect())
        spark_rows = theirs.option("stateVarName", name).load().collect()
        assert mine == sorted((r.key.part, r.key.user, r.value[0]) for r in spark_rows), name


RESHAPES = [
    pytest.param(Reshaped, "bigint", "runs", (2, 3), (2, 3), id="widened"),
    pytest.param(Reshaped, "renamed", "runs", (None, 1), (None, 1), id="renamed"),
    pytest.param(Reshaped, "renamed-int", "runs", (None, 1), (None, 1), id="renamed-int"),
    pytest.param(UnsafeReshaped, "renamed-int", "runs", (None, 1), (2, 3),
                 id="renamed-int-unsaferow"),
    pytest.param(UnsafeReshaped, "added", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", (2, 3), None,
                 id="added-unsaferow"),
    pytest.param(UnsafeReshaped, "bigint", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", (2, 3), None,
                 id="widened-unsaferow"),
]  # fmt: skip
"""(processor, stage, Spark's outcome, what ours reads of a's count of 2 written as ``n int``
and the count after its row, what Spark's does when it runs): ours runs every one, matching
fields by name; Spark refuses any other change of a variable's schema than a rename unless
its state rows are Avro-encoded (``UnsafeRow``, its default, is positional: a rename of a
field of the same type reads the old value, where Avro and ours read null)."""


def _outcome(run: Callable[[], object]) -> str:
    """``runs``, or the error class (``STATE_...``) of the refusal."""
    try:
        run()
    except (SchemaMismatch, StreamingQueryException) as e:
        found = re.search(r"\b(STATE_[A-Z_]+)", str(e))
        return found.group(1) if found else str(e)
    return "runs"


@pytest.mark.parametrize(
    ("processor", "change", "spark_says", "a_counts", "spark_a_counts"), RESHAPES
)
def test_a_schema_change_on_restart_has_sparks_outcome(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    processor: type[Reshaped],
    change: str,
    spark_says: str,
    a_counts: tuple[int | None, int],
    spark_a_counts: tuple[int | None, int] | None,
) -> None:
    """A value variable's field changed when the query restarts (``Reshaped``: ``n int``,
    then widened, renamed or with a field added) on both engines: with Avro-encoded state
    Spark runs the next batch and the outputs are equal (a widened value read as it was, a
    renamed one as null); with ``UnsafeRow`` Spark refuses (its error class) where ours runs
    as with Avro, or reads a renamed field of the same type by position (a's 2) where ours
    reads it as null, as Avro does."""
    stream = Stream(EVOLVING[:3], "UTC", 0, 0, 0, "update", None)
    first = replace(stream, batches=EVOLVING[:2])
    outcome = run_stream(
        spark, tws_operator("Reshaped int", processor, "None"), first, tmp_path, sqlite_catalog_url
    )
    assert outcome.check() == 2
    changed = tws_operator(f"Reshaped {change}", processor, "None", change)
    ours, theirs = next_batch(spark, changed, stream, tmp_path, sqlite_catalog_url, outcome, 2)
    assert _outcome(theirs) == spark_says
    assert _outcome(ours) == "runs"
    assert outcome.ours[2] == [(0, "a", a_counts[0], None, a_counts[1]), (0, "c", -1, None, 1)]
    if spark_a_counts is not None:
        a, c = (0, "a", spark_a_counts[0], None, spark_a_counts[1]), (0, "c", -1, None, 1)
        assert outcome.theirs[2] == [a, c]
    else:
        assert 2 not in outcome.theirs


REKEYS = [
    pytest.param(Rekeyed, "bigint", id="map-key-widened"),
    pytest.param(Rekeyed, "string", id="map-key-retyped"),
    pytest.param(Rekeyed, "value", id="map-to-value"),
    pytest.param(UnsafeRekeyed, "bigint", id="map-key-widened-unsaferow"),
]
"""(processor, stage) of a change of a variable's key schema on restart."""


@pytest.mark.parametrize(("processor", "change"), REKEYS)
def test_a_key_schema_change_on_restart_is_refused_by_both(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    processor: type[Rekeyed],
    change: str,
) -> None:
    """A variable's key schema changed when the query restarts (``Rekeyed``: a map with the
    user key ``k int``, then ``k bigint``, ``k string``, or a value of the same name): both
    engines refuse the next batch before running it, with Avro or ``UnsafeRow`` state
    (Spark's ``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``, our ``SchemaMismatch``)."""
    stream = Stream(EVOLVING[:3], "UTC", 0, 0, 0, "update", None)
    first = replace(stream, batches=EVOLVING[:2])
    outcome = run_stream(
        spark, tws_operator("Rekeyed int", processor, "None"), first, tmp_path, sqlite_catalog_url
    )
    assert outcome.check() == 2
    changed = tws_operator(f"Rekeyed {change}", processor, "None", change)
    ours, theirs = next_batch(spark, changed, stream, tmp_path, sqlite_catalog_url, outcome, 2)
    assert (_outcome(theirs), _outcome(ours)) == (
        "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
        "STATE_SCHEMA_MISMATCH",
    )
    assert 2 not in outcome.ours and 2 not in outcome.theirs


def test_a_null_key_reaches_the_pandas_processor_as_spark_hands_it(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Found by ``make fuzz-tws``: Spark's ``transformWithStateInPandas`` hands a null
    ``user`` key as the pandas frame holds it (``nan``), not ``None``; ours the same."""
    stream = Stream([[_at(0, None, 1, 1), _at(0, "a", 1, 2)]], "UTC", 0, 0, 0, "update", None)
    outcome = run_stream(
        spark, tws_operator("KeyEcho", KeyEcho, "None"), stream, tmp_path, sqlite_catalog_url
    )
    outcome.check()


def test_rows_without_a_time_beside_timed_rows_of_one_key(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Found by ``make fuzz-tws`` (``RowFraudDetector``): a key's batch with a row without a
    time and a timed row; the processor skips the first (it sorted both before, and the Row
    form's ``None`` does not compare with an int: the query failed)."""
    batches = [[_at(0, "c", None, 5), _at(0, "c", 0, 8)], [_at(0, "c", 10, 1)], []]
    stream = Stream(batches, "UTC", 0, 0, 0, "update", None)
    operator = tws_operator("RowFraudDetector", RowFraudDetector, "EventTime")
    outcome = run_stream(spark, operator, stream, tmp_path, sqlite_catalog_url)
    assert outcome.check() == 3
    assert outcome.ours[0] == [(0, "c", "open", T0, 8)]


@pytest.mark.parametrize("processor", [FraudDetector, RowFraudDetector], ids=["pandas", "Row"])
def test_rows_late_on_the_previous_batchs_watermark_are_dropped(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    processor: type[StatefulProcessor],
) -> None:
    """Found by ``make fuzz-tws`` (``FraudDetector``, shrunk by hand): in ``EventTime`` mode
    Spark drops the rows at or before the previous batch's watermark on the input's
    watermarked column, with no column named. Batch 1 (the null key's rows at ``T0+155``,
    not late on batch 0's watermark 0) moves the late rows' watermark to ``T0+255``, so
    batch 2's rows of ``a`` and ``c`` at ``T0`` are late: ``a``'s 9 opens no window (ours
    opened one: it dropped late rows only with an ``event_time_column``)."""

    def ev(user: str | None, at_ms: int, amount: int) -> Event:
        return (0, user, T0 + at_ms, amount)

    batches = [
        [ev("a", 0, 0), ev("a", 255, 0), ev("a", 255, 0)],
        [ev(None, 155, 9), ev(None, 155, 9)],
        [ev("a", 0, 9), ev("c", 540, 7), ev("c", 0, 0), ev("a", 0, 4), ev("c", 540, 7)],
    ]
    stream = Stream(batches, "UTC", 0, 4, 2, "update", None)
    operator = tws_operator(processor.__name__, processor, "EventTime")
    outcome = run_stream(spark, operator, stream, tmp_path, sqlite_catalog_url)
    assert outcome.ours == {
        0: [],
        1: [(0, None, "open", T0 + 155, 9)],
        2: [(0, "c", "open", T0 + 540, 7)],
    }
    assert outcome.check() == 3


def test_append_mode_and_a_maps_ttl_equal_spark(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Both engines in Append mode (Spark's ``transformWithState`` and its sink), a map with
    a TTL of 1 ms (gone by the next batch) beside one of an hour (kept)."""
    batches = [
        [_at(0, "a", 1, 1), _at(0, "a", 1, 2), _at(0, "b", 1, 4)],
        [_at(0, "a", 2, 3)],
        [_at(0, "b", 3, 5), _at(0, "a", 3, 6)],
    ]
    stream = Stream(batches, "UTC", 0, 0, 0, "append", None)
    operator = tws_operator(
        "RowExpiringMap", RowExpiringMap, "ProcessingTime", output_mode="Append"
    )
    outcome = run_stream(spark, operator, stream, tmp_path, sqlite_catalog_url)
    assert outcome.ours == {
        0: [(0, "a", 2, 2), (0, "b", 1, 1)],
        1: [(0, "a", 1, 3)],
        2: [(0, "a", 1, 3), (0, "b", 1, 2)],
    }
    assert outcome.check() == 3
