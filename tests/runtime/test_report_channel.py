"""No task report is ever lost, whatever the sink does with the output: the reports ride in the
stateful stage's data, an observation brings them back on the normal path, and when it does
not (no action, a few rows, an action whose observed metrics are lost, several actions that
overwrite them) the driver reads them from the data. Runs on classic and on Connect."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.runtime import Agg, StatefulQuery, read_state, running_aggregation

from .reference import assert_lineage_linear, running_totals

pytestmark = [pytest.mark.spark, pytest.mark.connect]
PARTITIONS = 3
BATCHES = 3
SCHEMA = "user string, amount bigint"


def _events(seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(40)}", rng.randrange(100)) for _ in range(150)]


def _noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def _several_actions(df: DataFrame, batch_id: int) -> None:
    # On Connect each action overwrites the observation: the last one saw two rows.
    df.count()
    _noop(df)
    df.limit(2).collect()


def _through_a_sql_view(df: DataFrame, batch_id: int) -> None:
    # The SQL query re-analyses the view's plan: its observed metrics never come back.
    df.createOrReplaceTempView(f"stateful_out_{batch_id}")
    df.sparkSession.sql(f"SELECT count(*) FROM stateful_out_{batch_id}").collect()


def _one_row(df: DataFrame, batch_id: int) -> None:
    df.limit(1).collect()


def _ignores_the_output(df: DataFrame, batch_id: int) -> None:
    return None


SINKS: dict[str, tuple[Callable[[DataFrame, int], None], int]] = {
    # sink, stage computations per batch (each writes one delta per partition)
    "noop": (lambda df, b: _noop(df), 1),
    "sql-view": (_through_a_sql_view, 2),
    "ignores-the-output": (_ignores_the_output, 1),
    "one-row": (_one_row, -1),  # Spark's limit may compute one partition or all of them
    "several-actions": (_several_actions, -1),
}


@pytest.mark.parametrize("name", list(SINKS))
def test_every_report_reaches_the_commit_whatever_the_sink(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, name: str
) -> None:
    sink, computations = SINKS[name]
    root = tmp_path / "ckpt"
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    query = StatefulQuery("reports", str(root), [op], catalog_url=sqlite_catalog_url)
    seen: list[tuple[str, int]] = []
    for batch_id in range(BATCHES):
        events = _events(batch_id)
        seen.extend(events)
        result = query.run_batch(spark.createDataFrame(events, SCHEMA), batch_id, sink=sink)
        result.release()
        assert sorted(r.info.store.partition_id for r in result.reports) == [0, 1, 2]
        assert result.metrics.rows_in == len(events)
        assert {i.version for i in result.infos} == {batch_id + 1}
    deltas = len(list(root.rglob("*.delta")))
    if computations > 0:
        assert deltas == computations * BATCHES * PARTITIONS
    state = read_state(spark, str(root), 0, catalog_url=sqlite_catalog_url).collect()
    assert {r.key.user: (r.value.n, r.value.total) for r in state} == running_totals(seen)
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == BATCHES * PARTITIONS


def test_chained_operators_reports_pass_through_the_later_stage(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """The first operator's reports travel through the second operator's tasks (on rows of
    their own), so both operators commit from one observation or one recovery job."""
    root = tmp_path / "ckpt"
    per_user = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], 3
    )
    per_bucket = running_aggregation(
        1, ["n"], "n bigint", [Agg("users", "count")], 2, store_name="buckets"
    )
    query = StatefulQuery(
        "chain", str(root), [per_user, per_bucket], catalog_url=sqlite_catalog_url
    )
    for batch_id in range(2):
        df = spark.createDataFrame(_events(10 + batch_id), SCHEMA)
        result = query.run_batch(df, batch_id, sink=_through_a_sql_view)
        stores = sorted(
            (r.info.store.operator_id, r.info.store.partition_id) for r in result.reports
        )
        assert stores == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        assert "__state_report" not in result.output.columns
        result.release()
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 2 * 5


def test_a_batch_without_a_sink_reads_no_observation(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a sink no action ran before the reports are read: the batch collects them from
    its cached output at once (a classic observation's read would wait its full second)."""

    def never(_: object) -> None:
        raise AssertionError("the observation was read, though no action had run")

    monkeypatch.setattr("state_runtime.runtime.query.observed", never)
    root = tmp_path / "ckpt"
    op = running_aggregation(0, ["user"], "user string", [Agg("n", "count")], PARTITIONS)
    query = StatefulQuery("no-sink", str(root), [op], catalog_url=sqlite_catalog_url)
    result = query.run_batch(spark.createDataFrame(_events(20), SCHEMA), 0)
    assert sorted(r.info.store.partition_id for r in result.reports) == [0, 1, 2]
    assert sum(r.n for r in result.output.collect()) == len(_events(20))
    result.release()
    assert len(list(root.rglob("*.delta"))) == PARTITIONS  # the stage computed once
