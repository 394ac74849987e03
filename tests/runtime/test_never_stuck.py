"""Every partition commits every batch whatever the input; bad batches are refused on the
driver before any task runs; a batch is one Spark job on the normal path."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import BatchOutOfOrder, InvalidArgument, SchemaMismatch
from state_runtime.runtime import (
    Agg,
    BatchResult,
    GroupState,
    StatefulQuery,
    map_groups_with_state,
    read_state,
    running_aggregation,
)
from state_runtime.runtime.spark_kind import is_connect

from .reference import assert_lineage_linear, running_totals

pytestmark = pytest.mark.spark
PARTITIONS = 3
SCHEMA = "user string, amount bigint"


def _events(seed: int, n: int = 100) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(30)}", rng.randrange(100)) for _ in range(n)]


def _totals(n: int = PARTITIONS, value: str = "bigint") -> Any:
    return running_aggregation(
        0,
        ["user"],
        "user string",
        [Agg("n", "count", type=value), Agg("total", "sum", "amount", type=value)],
        n,
    )


def _refused_before_any_job(spark: SparkSession, group: str, action: Callable[[], Any]) -> None:
    """Run ``action``, which must raise; on a classic session, check it ran no Spark job (a
    Connect client cannot count jobs: there the test checks that no delta was written)."""
    if is_connect(spark):
        action()
        return
    try:
        _jobs(spark, group, action)
    finally:
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []


def _jobs(spark: SparkSession, group: str, action: Callable[[], BatchResult]) -> tuple[Any, int]:
    """Run ``action`` in its own job group; return its result and the Spark jobs it ran."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        result = action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def _deltas(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.delta"))


@pytest.mark.connect
@pytest.mark.parametrize("adaptive", [True, False], ids=["aqe-on", "aqe-off"])
def test_every_partition_commits_every_batch_whatever_the_input(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, adaptive: bool
) -> None:
    root = tmp_path / "ckpt"
    query = StatefulQuery(
        "idle", str(root), [_totals()], catalog_url=sqlite_catalog_url, adaptive=adaptive
    )
    events = _events(1)
    inputs: list[tuple[list[tuple[str, int]], DataFrame]] = [
        (events, spark.createDataFrame(events, SCHEMA).repartition(2)),
        ([], spark.createDataFrame([], SCHEMA).repartition(2)),  # empty after a shuffle
        ([], spark.createDataFrame(_events(2), SCHEMA).where("amount < 0")),  # filtered out
        ([("solo", 5)] * 3, spark.createDataFrame([("solo", 5)] * 3, SCHEMA).repartition(2)),
    ]
    seen: list[tuple[str, int]] = []
    for batch_id, (rows, df) in enumerate(inputs):
        seen.extend(rows)
        result = query.run_batch(df, batch_id)
        assert sorted(r.info.store.partition_id for r in result.reports) == [0, 1, 2]
        assert {i.version for i in result.infos} == {batch_id + 1}
        assert result.metrics.rows_in == len(rows)
        result.release()
    state = read_state(spark, str(root), 0, catalog_url=sqlite_catalog_url).collect()
    assert {r.key.user: (r.value.n, r.value.total) for r in state} == running_totals(seen)
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 4 * PARTITIONS


@pytest.mark.parametrize("parallelism", [None, 1, 2, 3, 8])
def test_state_partitions_share_tasks(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, parallelism: int | None
) -> None:
    """``parallelism`` Spark tasks (default: the session's cores) run the state partitions,
    never more tasks than partitions; every partition still commits every batch."""
    root = tmp_path / "ckpt"
    query = StatefulQuery(
        "shared", str(root), [_totals()], catalog_url=sqlite_catalog_url, parallelism=parallelism
    )
    expected_tasks = min(parallelism or spark.sparkContext.defaultParallelism, PARTITIONS)
    seen: list[tuple[str, int]] = []
    sc = spark.sparkContext
    beats: list[DataFrame] = []
    for batch_id in range(3):
        events = _events(30 + batch_id)
        seen.extend(events)
        # foreachBatch hands every batch a new Python session over the same JVM session.
        session = SparkSession(sc, spark._jsparkSession)
        df = session.createDataFrame(events, SCHEMA)
        group = f"shared-{parallelism}-{batch_id}"
        result, jobs = _jobs(spark, group, partial(query.run_batch, df, batch_id, sink=_noop))
        assert jobs == 1
        [job] = sc.statusTracker().getJobIdsForGroup(group)
        job_info = sc.statusTracker().getJobInfo(job)
        assert job_info is not None
        stages = [sc.statusTracker().getStageInfo(s) for s in job_info.stageIds]
        stateful = max((s for s in stages if s is not None), key=lambda s: s.stageId)
        assert stateful.numTasks == expected_tasks
        assert sorted(r.info.store.partition_id for r in result.reports) == [0, 1, 2]
        beats.append(query._beats[PARTITIONS][1])
    assert beats[0] is beats[1] is beats[2]  # the heartbeat rows were built once, not per batch
    state = read_state(spark, str(root), 0, catalog_url=sqlite_catalog_url).collect()
    assert {r.key.user: (r.value.n, r.value.total) for r in state} == running_totals(seen)


def test_parallelism_must_be_positive(tmp_path: Path, sqlite_catalog_url: str) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidArgument, match="parallelism"):
            StatefulQuery(
                "bad", str(tmp_path), [_totals()], catalog_url=sqlite_catalog_url, parallelism=bad
            )


def _sessions(
    key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState
) -> list[tuple[Any, ...]]:
    if state.has_timed_out:
        return [(key[0], "ended")]
    state.update((len(rows),))
    state.set_timeout_duration(timedelta(minutes=1))
    return []


@pytest.mark.connect
def test_idle_batches_fire_processing_time_timeouts(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """AQE on, empty shuffled input: the partitions still run, and the idle keys time out."""
    op = map_groups_with_state(
        0, ["user"], "user string", "n bigint", "user string, status string", _sessions, 2
    )
    query = StatefulQuery(
        "timeouts", str(tmp_path / "ckpt"), [op], catalog_url=sqlite_catalog_url, adaptive=True
    )
    clock = 1_700_000_000_000
    events = [("ann", 1), ("bob", 2), ("cid", 3)]
    query.run_batch(spark.createDataFrame(events, SCHEMA), 0, batch_time_ms=clock).release()
    empty = spark.createDataFrame([], SCHEMA).repartition(2)
    result = query.run_batch(empty, 1, batch_time_ms=clock + 2 * 60_000)
    assert sorted(tuple(r) for r in result.output.collect()) == [
        ("ann", "ended"),
        ("bob", "ended"),
        ("cid", "ended"),
    ]
    result.release()


def _noop(df: DataFrame, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def test_one_spark_job_per_batch_and_sinks_with_several_actions(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = tmp_path / "ckpt"
    query = StatefulQuery("jobs", str(root), [_totals()], catalog_url=sqlite_catalog_url)
    seen: list[tuple[str, int]] = []
    for batch_id in range(3):
        events = _events(10 + batch_id)
        seen.extend(events)
        df = spark.createDataFrame(events, SCHEMA).repartition(2)
        run = partial(query.run_batch, df, batch_id, sink=_noop)
        result, jobs = _jobs(spark, f"jobs-{batch_id}", run)
        assert jobs == 1
        assert result.metrics.extra["duplicate_attempts"] == 0
        assert result.metrics.extra["cache_hit_rate"] == result.metrics.cache_hits / PARTITIONS
    assert len(_deltas(root)) == 3 * PARTITIONS

    counted: list[int] = []

    def twice(df: DataFrame, batch_id: int) -> None:
        counted.append(df.count())
        counted.append(len(df.collect()))

    # A sink that says it runs several actions gets the output cached: computed once.
    events = _events(20)
    seen.extend(events)
    df = spark.createDataFrame(events, SCHEMA)
    result = query.run_batch(df, 3, sink=twice, cache_output=True)
    assert result.metrics.extra["duplicate_attempts"] == 0
    assert len(_deltas(root)) == 4 * PARTITIONS
    result.release()
    # One that does not: each action recomputes the stage; the commit picks one checkpoint per
    # partition and the duplicates stay uncommitted.
    events = _events(21)
    seen.extend(events)
    df = spark.createDataFrame(events, SCHEMA)
    query.run_batch(df, 4, sink=twice).release()
    assert len(_deltas(root)) == 6 * PARTITIONS
    assert counted[0] == counted[1] > 0 and counted[2] == counted[3] > 0
    state = read_state(spark, str(root), 0, catalog_url=sqlite_catalog_url).collect()
    assert {r.key.user: (r.value.n, r.value.total) for r in state} == running_totals(seen)
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 5 * PARTITIONS


@pytest.mark.connect
def test_a_changed_schema_is_refused_on_the_driver(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = tmp_path / "ckpt"
    df = spark.createDataFrame(_events(3), SCHEMA)
    StatefulQuery("schema", str(root), [_totals()], catalog_url=sqlite_catalog_url).run_batch(
        df, 0
    ).release()
    before = _deltas(root)
    changed = StatefulQuery(
        "schema", str(root), [_totals(value="int")], catalog_url=sqlite_catalog_url
    )
    with pytest.raises(SchemaMismatch) as raised:
        _refused_before_any_job(spark, "schema", lambda: changed.run_batch(df, 1, sink=_noop))
    message = str(raised.value)
    assert "query schema, operator 0" in message
    assert (
        "value <n:bigint,total:bigint>> -> <key <user:string>, value <n:int,total:int>>" in message
    )
    assert "value field 'n': bigint -> int is not a widening" in message
    assert "value field 'total': bigint -> int is not a widening" in message
    assert _deltas(root) == before


@pytest.mark.connect
def test_a_batch_older_than_the_last_committed_is_refused_on_the_driver(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = tmp_path / "ckpt"
    query = StatefulQuery("order", str(root), [_totals()], catalog_url=sqlite_catalog_url)
    for batch_id in range(3):
        df = spark.createDataFrame(_events(batch_id), SCHEMA)
        query.run_batch(df, batch_id).release()
    before = _deltas(root)
    old = spark.createDataFrame(_events(1), SCHEMA)
    with pytest.raises(
        BatchOutOfOrder, match="batch 1 of query order is older than its last committed batch 2"
    ):
        _refused_before_any_job(spark, "order", lambda: query.run_batch(old, 1, sink=_noop))
    assert _deltas(root) == before
    # A batch after a gap is refused the same way.
    with pytest.raises(BatchOutOfOrder, match="batch 3 of query order is not committed"):
        query.run_batch(old, 4, sink=_noop)
    assert _deltas(root) == before
