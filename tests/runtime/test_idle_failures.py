"""A failed batch in a query where some store had an idle batch is that failure, not "state
lost": a version that changed nothing has no file record for the loss check to miss. The sink's
own error (or the user function's typed refusal) reaches the caller, no store is marked broken,
and the next run of the batch commits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.cli import main
from state_runtime.errors import InvalidArgument, StateLost
from state_runtime.runtime import (
    Agg,
    GroupState,
    StatefulQuery,
    map_groups_with_state,
    running_aggregation,
)

from .reference import running_totals
from .test_exactly_once import _df, _events, _state

pytestmark = pytest.mark.spark
PARTITIONS = 2
# Batch 0 changes both stores; batches 1 and 2 one user each: the other store is idle.
BATCHES = [_events(0, 40), [("ann", 1)], [("ann", 2)], _events(3, 40)]


def _no_store_broken(url: str) -> None:
    """``statestore health`` calls no store broken (never validated stores are "unknown",
    exit 3) and no problem is open."""
    cli = CliRunner(env={"COLUMNS": "200", "STATE_CATALOG_URL": None})
    health = cli.invoke(main, ["--catalog-url", url, "health"])
    assert health.exit_code == 3 and "broken" not in health.output, health.output
    assert "unknown" in health.output
    with Catalog.open(url) as catalog:
        assert all(h.open_problems == 0 for h in catalog.store_health(RetentionPolicy()))


def test_a_sink_failure_after_an_idle_batch_is_the_sinks_error(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    query = StatefulQuery("sink", root, [op], catalog_url=sqlite_catalog_url)
    for batch, events in enumerate(BATCHES[:3]):
        query.run_batch(_df(spark, events), batch).release()

    def down(df: DataFrame, batch_id: int) -> None:
        raise RuntimeError("the sink is down")

    with pytest.raises(RuntimeError, match="the sink is down") as failed:
        query.run_batch(_df(spark, BATCHES[3]), 3, sink=down)
    assert not isinstance(failed.value, StateLost)
    _no_store_broken(sqlite_catalog_url)

    query.run_batch(_df(spark, BATCHES[3]), 3, sink=lambda df, batch_id: df.count()).release()
    assert _state(spark, root, sqlite_catalog_url) == running_totals(
        e for events in BATCHES for e in events
    )


def _refusing(marker: Path) -> Callable[..., list[tuple[Any, ...]]]:
    def count(
        key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState
    ) -> list[tuple[Any, ...]]:
        if key[0] == "bob" and marker.exists():
            raise InvalidArgument("bob's rows are refused")
        clicks = (state.get() or (0,))[0] + len(rows)
        state.update((clicks,))
        return [(key[0], clicks)]

    return count


def test_a_typed_refusal_of_the_update_function_after_an_idle_batch_is_that_refusal(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    marker = tmp_path / "refuse"
    op = map_groups_with_state(
        0,
        ["user"],
        "user string",
        "clicks bigint",
        "user string, clicks bigint",
        _refusing(marker),
        PARTITIONS,
    )
    root = str(tmp_path / "ckpt")
    query = StatefulQuery("refusal", root, [op], catalog_url=sqlite_catalog_url)
    batches = [
        [("ann", 1), ("bob", 1), ("cid", 1), ("dan", 1), ("eve", 1)],
        [("ann", 2)],
        [("ann", 3)],
        [("bob", 2), ("cid", 2)],
    ]
    for batch, events in enumerate(batches[:3]):
        df = spark.createDataFrame(events, "user string, page bigint")
        query.run_batch(df, batch).release()
    marker.touch()
    last = spark.createDataFrame(batches[3], "user string, page bigint")
    with pytest.raises(Exception, match="bob's rows are refused") as failed:
        query.run_batch(last, 3)
    assert not isinstance(failed.value, StateLost)
    assert "STATE_LOST" not in str(failed.value)
    _no_store_broken(sqlite_catalog_url)

    marker.unlink()
    result = query.run_batch(last, 3)
    assert sorted(tuple(r) for r in result.output.collect()) == [("bob", 2), ("cid", 2)]
    result.release()
