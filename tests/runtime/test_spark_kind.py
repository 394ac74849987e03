"""The few differences between classic and Connect sessions, known without the JVM: no
``sparkContext``, ``_jsparkSession`` or observation JVM object anywhere in the product, the
application's parallelism without a job per batch, a session's identity, observations read
without blocking, and one analysis of a batch's input."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import state_runtime
from state_runtime.runtime import Agg, StatefulQuery, running_aggregation
from state_runtime.runtime.spark_kind import (
    default_parallelism,
    is_connect,
    observation,
    observed,
    session_mark,
)

# JVM handles of pyspark's classic objects: none may appear on a user path (issue 25).
JVM_ATTRIBUTES = {"sparkContext", "_jsparkSession", "_jo", "_jvm", "_jdf", "_jsc", "_sc", "_jc"}


def test_the_product_uses_no_jvm_handle() -> None:
    """Every attribute access in state_runtime/ is scanned; none is allowed (no allowlist)."""
    found = []
    for path in sorted(Path(state_runtime.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in JVM_ATTRIBUTES:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "getattr"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in JVM_ATTRIBUTES
            ):
                found.append(f"{path.name}:{node.lineno} getattr {node.args[1].value}")
    assert found == []


@pytest.mark.spark
@pytest.mark.connect
def test_default_parallelism_is_the_applications(spark: SparkSession) -> None:
    # The test session runs on local[2,4] (two cores), or on local-cluster[2,1,1024] (two
    # executors of one core each) in the `executors` pass.
    assert default_parallelism(spark) == 2
    if not is_connect(spark):
        assert default_parallelism(spark) == spark.sparkContext.defaultParallelism


@pytest.mark.spark
@pytest.mark.connect
def test_session_mark_names_the_session(spark: SparkSession) -> None:
    assert session_mark(spark) == session_mark(spark)
    other = spark.newSession()
    assert session_mark(other) != session_mark(spark)
    if not is_connect(spark):
        # foreachBatch's new Python session over the same JVM session is the same session.
        wrapper = SparkSession(spark.sparkContext, spark._jsparkSession)
        assert session_mark(wrapper) == session_mark(spark)


@pytest.mark.spark
@pytest.mark.connect
def test_observed_never_waits_for_an_action_that_did_not_run(spark: SparkSession) -> None:
    channel = observation()
    df = spark.range(10).observe(channel, F.count(F.lit(1)).alias("n"))
    started = time.perf_counter()
    assert observed(channel) == {}  # no action ran: nothing, at once
    assert time.perf_counter() - started < 5
    assert df.filter("id > 4").count() == 5
    deadline = time.monotonic() + 60  # each read waits about a second (long on a loaded machine)
    while not observed(channel) and time.monotonic() < deadline:
        pass
    assert observed(channel) == {"n": 10}


def _noop(df: DataFrame, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


@pytest.mark.spark
@pytest.mark.connect
def test_a_batch_analyses_its_input_once(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = [
        running_aggregation(0, ["user"], "user string", [Agg("n", "count")], 2),
        running_aggregation(1, ["n"], "n bigint", [Agg("users", "count")], 2),
    ]
    query = StatefulQuery("analysed", str(tmp_path / "ckpt"), ops, catalog_url=sqlite_catalog_url)
    df = spark.createDataFrame([("ann", 1), ("bob", 2), ("ann", 3)], "user string, amount bigint")
    cls = type(df)
    original = cls.schema
    reads: list[str] = []

    def schema(self: DataFrame) -> object:
        if self is df:  # (classic mapInArrow analyses its own input: the routed rows)
            reads.append("schema")
        return original.__get__(self)

    monkeypatch.setattr(cls, "schema", property(schema))
    for batch_id in range(2):
        reads.clear()
        query.run_batch(df, batch_id, sink=_noop).release()
        assert reads == ["schema"]
