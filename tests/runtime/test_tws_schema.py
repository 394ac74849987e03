"""Schema evolution of ``transform_with_state`` state variables across restarts: each variable
is a store with its own schema history, planned on the driver by the stores' schema evolution
(:mod:`state_runtime.store.schema_evolution`) before any batch runs. The processor is
:class:`~.tws_processors.Evolving`; its runs against Spark's own engine are in
``test_tws_vs_spark.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import SchemaMismatch
from state_runtime.runtime import StatefulQuery, read_state, transform_with_state

from .tws_processors import KEY, Evolving

pytestmark = pytest.mark.spark


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


def test_variables_added_evolved_and_dropped_across_restarts(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """A new variable gets a new store; a nullable field added to a variable evolves its store
    (a new entry of its schema history, read by ``read_state(state_variable=)``); a variable no
    longer declared keeps its store and rows."""
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
        ("a", 3, "v2", -1, 5),
        ("b", 2, None, -1, -1),
    ]
    assert read("seen").count() == 7  # as v2 left it: a's 2 elements, b's and c's 1, 3 heads
    histories = Catalog.open(sqlite_catalog_url).schema_histories(root.as_uri())

    with pytest.raises(SchemaMismatch) as refused:
        _run(spark, _query(root, sqlite_catalog_url, "retyped"), 3, "a")
    assert str(refused.value).startswith(
        "[STATE_SCHEMA_MISMATCH] query evolving, transform_with_state (operator 0), value state "
        "variable 'count' (store count): schema change <key <part:int,user:string>, value "
        "<n:bigint,note:string>> -> <key <part:int,user:string>, value <n:string,note:string>> "
        "refused: value field 'n': bigint -> string is not a widening"
    )
    assert "\n" not in str(refused.value)
    assert Catalog.open(sqlite_catalog_url).schema_histories(root.as_uri()) == histories
    # refused before anything was written: the previous code goes on at the same batch
    assert _run(spark, _query(root, sqlite_catalog_url, "v3"), 3, "c") == [("c", 2, "v2", -1, 5)]
