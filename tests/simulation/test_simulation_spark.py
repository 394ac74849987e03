"""The simulation through the real runtime on Spark: a random run of batches (idle, failing,
replayed, out of order) interleaved with snapshots, cleanup, validation, restore, new drivers,
clock steps and repartitions, checked against the same model and invariants as the
library-level run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.simulation.spark_platform import SparkMachine, SparkPlatform, spark_steps
from tests.simulation.steps import AROUND_A_REPARTITION, ONLY_THE_FIRST_STORE, replay, run

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


@pytest.mark.usefixtures("on_spark")
def test_batches_around_a_repartition_through_the_runtime() -> None:
    """Batches on 2 partitions, a repartition to 3 (the model's rows only move), batches on
    the new layout (one store idle), cleanup at zero windows, validation, and a restore to the
    repartitioned batch: every version equals the model, loads and is called sound."""
    machine = replay(
        AROUND_A_REPARTITION,
        SparkMachine,
    )
    assert machine.model.partitions == 3 and machine.repartitioned_at == 1
