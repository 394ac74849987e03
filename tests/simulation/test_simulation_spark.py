"""The simulation through the real runtime on Spark: a random run of batches (idle, failing,
replayed, out of order) interleaved with snapshots, cleanup, validation, restore, new drivers
and clock steps, checked against the same model and invariants as the library-level run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.simulation.spark_platform import SparkMachine, SparkPlatform, spark_steps
from tests.simulation.steps import replay
from tests.simulation.test_found import ONLY_THE_FIRST_STORE, run

pytestmark = pytest.mark.spark


@pytest.fixture
def on_spark(spark: SparkSession) -> Iterator[None]:
    SparkPlatform.spark = spark
    yield
    SparkPlatform.spark = None


@pytest.mark.usefixtures("on_spark")
@pytest.mark.parametrize("seed", [3401])
def test_a_random_run_through_the_runtime(seed: int) -> None:
    replay(spark_steps(seed, 14), SparkMachine)


@pytest.mark.usefixtures("on_spark")
def test_a_sink_outage_after_an_idle_batch_through_the_runtime() -> None:
    """The issue's report, through the runtime: store 1 idle in batch 1, the sink down in
    batch 2 (after the tasks wrote): the sink's error, no store broken, batch 2 commits."""
    replay([run(ONLY_THE_FIRST_STORE), run(ONLY_THE_FIRST_STORE, fail="sink")], SparkMachine)
