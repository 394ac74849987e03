"""``spark.read.format("state_runtime")`` reads what ``read_state``, ``read_state_changes`` and
``read_state_metadata`` read, with Spark's option names, from the DataFrame API and from SQL,
on classic and on Connect."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import DataFrameReader, SparkSession

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import (
    Agg,
    StatefulQuery,
    read_state,
    read_state_changes,
    read_state_metadata,
    running_aggregation,
)
from state_runtime.runtime.datasource import StateDataSource, register_state_sources

from .reference import running_totals
from .tws_processors import session_tracker_batches

pytestmark = [pytest.mark.spark, pytest.mark.connect]
SCHEMA = "user string, amount bigint"


def _rows(df: object) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in df.collect())  # type: ignore[attr-defined]


def test_state_changes_and_metadata_through_the_data_source(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], 2
    )
    query = StatefulQuery("source", root, [op], catalog_url=sqlite_catalog_url)
    rng = random.Random(7)
    batches = [[(f"u{rng.randrange(20)}", rng.randrange(50)) for _ in range(60)] for _ in range(3)]
    for batch_id, events in enumerate(batches):
        query.run_batch(spark.createDataFrame(events, SCHEMA), batch_id).release()
    register_state_sources(spark)
    reader = spark.read.format("state_runtime").option("catalogUrl", sqlite_catalog_url)

    latest = reader.option("operatorId", 0).load(root)
    assert {r.key.user: (r.value.n, r.value.total) for r in latest.collect()} == running_totals(
        [e for events in batches for e in events]
    )
    at_batch_1 = reader.options(batchId=1, queryId="source").load(root)
    assert {r.key.user: (r.value.n, r.value.total) for r in at_batch_1.collect()} == (
        running_totals(batches[0] + batches[1])
    )
    assert _rows(at_batch_1) == _rows(
        read_state(spark, root, 0, batch_id=1, query_id="source", catalog_url=sqlite_catalog_url)
    )
    changes = reader.options(readChangeFeed=True, changeStartBatchId=1, changeEndBatchId=2)
    assert _rows(changes.load(root)) == _rows(
        read_state_changes(spark, root, 0, 1, 2, catalog_url=sqlite_catalog_url)
    )
    assert {r.batch_id for r in changes.load(root).collect()} == {1, 2}
    metadata = (
        spark.read.format("state_runtime_metadata")
        .option("catalogUrl", sqlite_catalog_url)
        .load(root)
    )
    assert _rows(metadata) == _rows(
        read_state_metadata(spark, root, catalog_url=sqlite_catalog_url)
    )

    # From SQL: a temporary view over the source, with the same options.
    spark.sql(
        "CREATE OR REPLACE TEMPORARY VIEW source_state USING state_runtime "
        f"OPTIONS (path '{root}', catalogUrl '{sqlite_catalog_url}', operatorId '0')"
    )
    total = spark.sql("SELECT sum(value.n) AS n FROM source_state").first()
    assert total is not None and total.n == sum(len(b) for b in batches)


def test_bad_options_are_named(spark: SparkSession, sqlite_catalog_url: str) -> None:
    register_state_sources(spark)

    def reader() -> DataFrameReader:  # a DataFrameReader keeps the options it was given
        return spark.read.format("state_runtime").option("catalogUrl", sqlite_catalog_url)

    with pytest.raises(Exception, match="changeStartBatchId and changeEndBatchId"):
        reader().option("readChangeFeed", True).load("/tmp/nowhere").collect()
    with pytest.raises(Exception, match="batchId='one': expected a whole number"):
        reader().option("batchId", "one").load("/tmp/nowhere").collect()


def test_a_state_variable_and_the_timers_through_the_data_source(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """``stateVarName`` and ``readRegisteredTimers`` (Spark's names) read what
    ``read_state(state_variable=)`` and ``(timers=True)`` read, state and change feed."""
    root = str(tmp_path / "ckpt")
    session_tracker_batches(spark, root, "tws", sqlite_catalog_url)
    register_state_sources(spark)

    def reader() -> DataFrameReader:  # a DataFrameReader keeps the options it was given
        return spark.read.format("state_runtime").option("catalogUrl", sqlite_catalog_url)

    changes = {"readChangeFeed": True, "changeStartBatchId": 0, "changeEndBatchId": 1}
    for option, which in [
        (("stateVarName", "amounts"), {"state_variable": "amounts"}),
        (("readRegisteredTimers", "true"), {"timers": True}),
    ]:
        state = _rows(reader().option(*option).load(root))
        assert state and state == _rows(
            read_state(spark, root, 0, catalog_url=sqlite_catalog_url, **which)  # type: ignore[arg-type]
        )
        feed = _rows(reader().option(*option).options(**changes).load(root))
        assert feed and feed == _rows(
            read_state_changes(spark, root, 0, 0, 1, catalog_url=sqlite_catalog_url, **which)  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    "options",
    [
        {"stateVarName": "amounts", "storeName": "default"},
        {"stateVarName": "amounts", "readRegisteredTimers": "true"},
        {"storeName": "default", "readRegisteredTimers": "TRUE"},
    ],
)
def test_more_than_one_option_picking_the_store_is_refused(
    options: dict[str, str], tmp_path: Path
) -> None:
    """Before any catalog or storage read: the options are checked first."""
    names = [n for n in ("storeName", "stateVarName", "readRegisteredTimers") if n in options]
    with pytest.raises(InvalidArgument, match=f"options {' and '.join(names)}: each picks"):
        StateDataSource({"path": str(tmp_path), **options}).schema()
    with pytest.raises(InvalidArgument, match="readRegisteredTimers='yes': expected true or"):
        StateDataSource({"path": str(tmp_path), "readRegisteredTimers": "yes"}).schema()
