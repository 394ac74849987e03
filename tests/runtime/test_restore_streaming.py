"""A real Structured Streaming query with a Spark checkpoint loses a state file; ``statestore
restore --spark-checkpoint`` returns the catalog and Spark's checkpoint to an intact batch; the
restarted query resumes there, and its state equals Spark's own aggregation of every event."""

from __future__ import annotations

import random
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.catalog import Catalog
from state_runtime.cli import main
from state_runtime.runtime import (
    Agg,
    StatefulQuery,
    read_state,
    running_aggregation,
    write_stream,
)

from .reference import assert_lineage_linear

pytestmark = pytest.mark.spark
PARTITIONS = 3


def test_restore_rewinds_catalog_and_spark_checkpoint_and_the_stream_resumes(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    source = tmp_path / "events"
    source.mkdir()
    root = str(tmp_path / "ckpt")
    spark_ckpt = tmp_path / "spark-checkpoint"
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )

    def write_file(i: int) -> None:
        rng = random.Random(i)
        events = [(f"user{rng.randrange(30)}", rng.randrange(100)) for _ in range(40)]
        spark.createDataFrame(events, "user string, amount bigint").coalesce(1).write.json(
            str(source / f"part-{i}")
        )

    sunk: list[int] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        df.count()
        sunk.append(batch_id)

    def run() -> None:
        query = StatefulQuery("clicks", root, [op], catalog_url=sqlite_catalog_url)
        events = (
            spark.readStream.schema("user string, amount bigint")
            .option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true")
            .json(str(source))
        )
        stream = (
            write_stream(query, events, str(spark_ckpt), sink).trigger(availableNow=True).start()
        )
        try:
            stream.awaitTermination(300)
        finally:
            stream.stop()

    for i in range(4):
        write_file(i)
    run()
    assert sorted(set(sunk)) == [0, 1, 2, 3]
    # The real fault: batch 3's delta of one store is deleted by hand.
    (lost,) = (tmp_path / "ckpt" / "state" / "0" / "1" / "default").glob("4_*.delta")
    lost.unlink()

    runner = CliRunner(env={"COLUMNS": "200", "STATE_CATALOG_URL": None})
    args = ["--catalog-url", sqlite_catalog_url, "-q", "restore", root, "--query", "clicks"]
    refused = runner.invoke(main, [*args, "--to-batch", "3", "--spark-checkpoint", str(spark_ckpt)])
    assert refused.exit_code == 3, refused.output
    assert lost.name in refused.output and "--to-batch 2" in refused.output
    # explain's command, run as printed: write_stream told the runtime Spark's checkpoint
    explained = runner.invoke(main, ["--catalog-url", sqlite_catalog_url, "explain", str(lost)])
    (command,) = re.findall(r"run `(statestore [^`]+)`", " ".join(explained.output.split()))
    assert f"--to-batch 2 --spark-checkpoint {spark_ckpt} --execute" in command, command
    done = runner.invoke(main, ["--catalog-url", sqlite_catalog_url, *shlex.split(command)[1:]])
    assert done.exit_code == 0, done.output
    assert "resumes at batch 3" in done.output
    for log in ("offsets", "commits"):
        assert not (spark_ckpt / log / "3").exists()
        assert (spark_ckpt / log / "2").exists()
    assert list(spark_ckpt.glob("restored-by-run-*/offsets/3"))  # kept aside, not deleted

    write_file(4)
    sunk.clear()
    run()
    assert sunk and sunk[0] == 3  # Spark resumed at the batch after the restored one

    state = read_state(spark, root, 0, catalog_url=sqlite_catalog_url).collect()
    got = {r.key.user: (r.value.n, r.value.total) for r in state}
    oracle = (
        spark.read.schema("user string, amount bigint")
        .option("recursiveFileLookup", "true")
        .json(str(source))
        .groupBy("user")
        .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
        .collect()
    )
    assert got == {r.user: (r.n, r.total) for r in oracle}
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert (
            assert_lineage_linear(
                catalog, StatefulQuery("clicks", root, [op], catalog_url=sqlite_catalog_url).storage
            )
            > 0
        )
