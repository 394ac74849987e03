"""Schema evolution of ``transform_with_state`` state variables across restarts: each variable
is a store with its own schema history, planned on the driver by the stores' schema evolution
(:mod:`state_runtime.store.schema_evolution`) before any batch runs. The processor is
:class:`~.tws_processors.Evolving`; its runs against Spark's own engine are in
``test_tws_vs_spark.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from state_runtime.catalog import Catalog
from state_runtime.errors import SchemaMismatch
from state_runtime.runtime import SchemaChange, StatefulQuery, read_state, transform_with_state
from state_runtime.runtime.registration import planned_histories
from state_runtime.store.schema_history import SchemaHistory

from .tws_processors import KEY, Evolving


def _query(root: Path, catalog_url: str, stage: str) -> StatefulQuery:
    op = transform_with_state(
        0, ["part", "user"], KEY, Evolving(stage), Evolving.SCHEMA, 2, pandas=False
    )
    return StatefulQuery("evolving", str(root), [op], catalog_url=catalog_url)


def _run(spark: SparkSession, query: StatefulQuery, batch_id: int, users: str) -> list[tuple]:
    df = spark.createDataFrame([(0, u, 5) for u in users], "part int, user string, amount bigint")
    result = query.run_batch(df, batch_id)
    rows = sorted(tuple(r)[1:] for r in result.output.collect())
    result.release()
    return rows


@pytest.mark.spark
def test_variables_added_evolved_and_dropped_across_restarts(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """A new variable gets a new store; a nullable field added to a variable evolves its store
    (a new entry of its schema history, read by ``read_state(state_variable=)``), a field no
    longer declared is dropped (as Spark's Avro evolution); a variable no longer declared keeps
    its store and rows until ``init`` deletes it (``deleteIfExists``: every row goes, as Spark
    removes the variable's column family); a type change is refused, naming the variable,
    before anything is written."""
    root = tmp_path / "ckpt"
    assert _run(spark, _query(root, sqlite_catalog_url, "v1"), 0, "ab") == [
        ("a", 1, None, 1, -1),
        ("b", 1, None, 1, -1),
    ]
    v2 = _query(root, sqlite_catalog_url, "v2")
    assert _run(spark, v2, 1, "ac") == [("a", 2, None, 2, -1), ("c", 1, None, 1, -1)]
    histories = Catalog.open(sqlite_catalog_url).schema_histories(root.as_uri())
    count = histories[(0, "count")]
    assert [e.schema.value.simpleString() for e in count.entries] == [
        "struct<n:bigint>",
        "struct<n:bigint,note:string>",
    ]
    assert count.newest.from_batch == 1
    assert len(histories[(0, "last")].entries) == 1
    read = lambda name: read_state(  # noqa: E731
        spark, str(root), 0, state_variable=name, catalog_url=sqlite_catalog_url
    )
    assert sorted((r.key.user, r.value.n, r.value.note) for r in read("count").collect()) == [
        ("a", 2, "v2"),
        ("b", 1, None),  # written under v1, read under the evolved schema
        ("c", 1, "v2"),
    ]
    assert _run(spark, _query(root, sqlite_catalog_url, "v3"), 2, "ab") == [
        ("a", 3, None, -1, 5),
        ("b", 2, None, -1, -1),
    ]
    assert read("seen").count() == 7  # as v2 left it: a's 2 elements, b's and c's 1, 3 heads
    v4 = _query(root, sqlite_catalog_url, "v4")  # deletes "seen" without declaring it
    assert _run(spark, v4, 3, "b") == [("b", 3, None, -1, 5)]
    assert read("seen").count() == 0  # every partition's, not only the batch's keys'
    assert read("count").count() == 3
    histories = Catalog.open(sqlite_catalog_url).schema_histories(root.as_uri())
    assert histories[(0, "count")].newest.change == SchemaChange(dropped=("note",))

    with pytest.raises(SchemaMismatch) as refused:
        _run(spark, _query(root, sqlite_catalog_url, "retyped"), 4, "a")
    assert str(refused.value).startswith(
        "[STATE_SCHEMA_MISMATCH] query evolving, transform_with_state (operator 0), value state "
        "variable 'count' (store count): schema change <key <part:int,user:string>, value "
        "<n:bigint>> -> <key <part:int,user:string>, value <n:string>> "
        "refused: value field 'n': bigint -> string is not a widening"
    )
    assert "\n" not in str(refused.value)
    assert Catalog.open(sqlite_catalog_url).schema_histories(root.as_uri()) == histories
    # refused before anything was written: the previous code goes on at the same batch
    assert _run(spark, _query(root, sqlite_catalog_url, "v3"), 4, "c") == [("c", 2, None, -1, 5)]


@pytest.mark.spark
def test_a_replay_of_the_batch_that_adds_a_variable_reads_it_empty(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """A variable first declared in batch 1 (``last``, new in v2) has nothing before that
    batch: its replay (a driver that died before Spark's commit) reads it empty, as the batch
    did. ``Catalog.committed_before`` fell back to the batch's own commit: the replay built
    on version 1 and was refused on every run (CommitConflict: it commits version 2)."""
    root = tmp_path / "ckpt"
    _run(spark, _query(root, sqlite_catalog_url, "v1"), 0, "ab")
    first = _run(spark, _query(root, sqlite_catalog_url, "v2"), 1, "ac")
    assert first == [("a", 2, None, 2, -1), ("c", 1, None, 1, -1)]
    assert _run(spark, _query(root, sqlite_catalog_url, "v2"), 1, "ac") == first


class Declares(StatefulProcessor):
    """A processor declaring one variable, ``x``, as ``kind[+ttl];schema[;value schema]``."""

    def __init__(self, declare: str) -> None:
        self.declare = declare

    def init(self, handle: StatefulProcessorHandle) -> None:
        kind, *schemas = self.declare.split(";")
        ttl = {"ttlDurationMs": 60_000} if kind.endswith("+ttl") else {}
        method = {"value": handle.getValueState, "list": handle.getListState}.get(
            kind.removesuffix("+ttl"), handle.getMapState
        )
        method("x", *schemas, **ttl)

    def handleInputRows(self, key: object, rows: object, timerValues: object) -> None:
        return None


def _declaring(tmp_path: Path, catalog_url: str, declare: str) -> StatefulQuery:
    op = transform_with_state(
        0, ["user"], "user string", Declares(declare), "user string", 1,
        time_mode="ProcessingTime",
    )  # fmt: skip
    return StatefulQuery("plan", str(tmp_path / "ckpt"), [op], catalog_url=catalog_url)


def _plan(tmp_path: Path, catalog_url: str, before: str, after: str) -> SchemaHistory:
    """The driver's plan of variable ``x`` declared as ``after`` over its recorded history of
    ``before``, as a restart plans it before its first batch (no Spark needed)."""
    first, second = (_declaring(tmp_path, catalog_url, d) for d in (before, after))
    recorded = planned_histories("plan", first.root, first.operators, 0, {})[(0, "x")]
    first.catalog.record_schema_history(first.root, 0, "x", recorded)
    known = second.catalog.registered(second.root).histories
    return planned_histories("plan", second.root, second.operators, 1, known)[(0, "x")]


@pytest.mark.parametrize(
    ("before", "after", "refusal"),
    [
        ("value;n bigint", "list;n bigint", "key fields cannot be added or removed"),
        ("map;k int;n bigint", "map;k bigint;n bigint", "key field 'k': int -> bigint"),
        ("value;n bigint", "value;n int", "value field 'n': bigint -> int is not a widening"),
    ],
)
def test_refused_changes_name_the_variable(
    tmp_path: Path, sqlite_catalog_url: str, before: str, after: str, refusal: str
) -> None:
    """A change of a variable's kind, of a map's user key type, a narrowing: refused on the
    driver, the message naming the operator, the variable and its kind, and the field."""
    with pytest.raises(SchemaMismatch) as refused:
        _plan(tmp_path, sqlite_catalog_url, before, after)
    kind = after.split(";")[0]
    message = str(refused.value)
    assert f"query plan, transform_with_state (operator 0), {kind} state variable 'x'" in message
    assert refusal in message


@pytest.mark.parametrize(
    ("before", "after", "dropped"),
    [
        ("value;n bigint, m int", "value;n bigint", ("m",)),
        ("value+ttl;n bigint", "value;n bigint", ("__expires_ms",)),
        ("value;n int", "value+ttl;n bigint, note string", ()),
    ],
)
def test_allowed_changes_are_recorded(
    tmp_path: Path, sqlite_catalog_url: str, before: str, after: str, dropped: tuple[str, ...]
) -> None:
    """A field or a TTL no longer declared is dropped (Spark's Avro evolution reads older
    values without the fields its new schema lacks); an added nullable field, a TTL added
    or a widening runs: each a new entry of the variable's history."""
    history = _plan(tmp_path, sqlite_catalog_url, before, after)
    assert len(history.entries) == 2
    assert history.newest.change == SchemaChange(dropped=dropped)
