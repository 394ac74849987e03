"""The moment of loss: a store's folder is deleted by hand between batches; the next batch
fails with one paragraph naming the store, the file, the cause and the command to run,
the loss is recorded so that ``statestore health`` reports the store broken (exit 2), and
``statestore restore --allow-lost-state`` lets the query go on."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from state_runtime.cli import main
from state_runtime.errors import StateLost
from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
from state_runtime.store.config import StoreConfig

from .reference import running_totals
from .test_exactly_once import _df, _events, _state

pytestmark = pytest.mark.spark
PARTITIONS = 3


def test_a_lost_store_folder_is_named_once_with_the_next_commands(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    query = StatefulQuery("loss", root, [op], catalog_url=sqlite_catalog_url)
    for batch in range(3):
        query.run_batch(_df(spark, _events(batch)), batch).release()
    shutil.rmtree(tmp_path / "ckpt" / "state" / "0" / "1" / "default")
    # A restarted application: its workers hold no copy of the state in memory (a store
    # config of its own gives it providers of its own in the reused Python workers).
    restarted = dataclasses.replace(op, config=StoreConfig(min_deltas_for_snapshot=11))
    query = StatefulQuery("loss", root, [restarted], catalog_url=sqlite_catalog_url)

    with pytest.raises(StateLost) as lost:
        query.run_batch(_df(spark, _events(3)), 3)
    message = str(lost.value)
    assert "\n" not in message and message.count("is missing from storage") == 1
    assert f"store {query.root}#0/1/default: delta state/0/1/default/1_" in message
    assert "(version 1) is missing from storage" in message
    assert "no committed batch of query loss has all its stores intact" in message
    assert (  # this query did not say where its Spark checkpoint is: the step says what DIR is
        "find the stream's checkpointLocation (its writeStream option; the runtime was not told "
        f"it), then run `statestore restore {query.root} --query loss --to-batch 2 "
        "--spark-checkpoint DIR --allow-lost-state --execute` with DIR set to it"
    ) in message

    cli = CliRunner(env={"COLUMNS": "200", "STATE_CATALOG_URL": None})
    health = cli.invoke(main, ["--catalog-url", sqlite_catalog_url, "-q", "status"])
    assert health.exit_code == 2, health.output  # broken, for a monitor
    assert "broken" in health.output and "is missing from storage" in health.output

    restored = cli.invoke(
        main,
        [
            "--catalog-url",
            sqlite_catalog_url,
            "-q",
            "restore",
            root,
            "--query",
            "loss",
            "--to-batch",
            "2",
            "--no-spark-checkpoint",
            "--allow-lost-state",
            "--execute",
        ],
    )
    assert restored.exit_code == 0, restored.output
    query.run_batch(_df(spark, _events(3)), 3).release()
    # Partition 1's keys restarted from empty at batch 3; the others kept everything.
    state = _state(spark, root, sqlite_catalog_url)
    everything = running_totals(_events(0) + _events(1) + _events(2) + _events(3))
    only_last = running_totals(_events(3))
    assert {u for u in state} <= set(everything)
    differing = {u for u in state if state[u] != everything[u]}
    assert differing and all(state[u] == only_last[u] for u in differing)
