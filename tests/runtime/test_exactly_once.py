"""Exactly-once state under failure: failed and duplicate task attempts, a driver that dies
between the tasks' commits and the catalog commit, and a query restart from its checkpoint.
In every case the state equals a plain-Python reference and every committed lineage is linear."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.catalog.records import Verdict
from state_runtime.catalog.sql.retention import RetentionPolicy
from state_runtime.errors import CatalogUnavailable
from state_runtime.maintenance import Fleet, MaintenancePolicy, sweep_attempts
from state_runtime.runtime import (
    Agg,
    StatefulOperator,
    StatefulQuery,
    read_state,
    running_aggregation,
    worker,
)
from state_runtime.runtime.aggregation import _RunningAggregate
from state_runtime.storage import Storage, open_storage
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_store import StateStore

from .reference import assert_lineage_linear, running_totals

pytestmark = [pytest.mark.spark, pytest.mark.connect]
PARTITIONS = 3


def _events(seed: int, n: int = 200) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(50)}", rng.randrange(100)) for _ in range(n)]


def _df(spark: SparkSession, events: list[tuple[str, int]]) -> DataFrame:
    return spark.createDataFrame(events, "user string, amount bigint").repartition(2)


def _state(spark: SparkSession, root: str, url: str) -> dict[str, tuple[int, int]]:
    rows = read_state(spark, root, 0, catalog_url=url).collect()
    return {r.key.user: (r.value.n, r.value.total) for r in rows}


class _Flaky:
    """Runs the real aggregation, then on the first attempt of some partitions writes a
    duplicate attempt's delta (as a speculative copy would) and fails the task."""

    def __init__(self, storage: Storage, failing: set[int]) -> None:
        self.inner = _RunningAggregate(
            ("user",), (Agg("n", "count"), Agg("total", "sum", "amount"))
        )
        self.storage = storage
        self.failing = failing

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        out = self.inner(store, rows)
        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.attemptNumber() == 0 and ctx.partitionId() in self.failing:
            provider = worker.provider_for(
                self.storage, store.store_id, SchemaHistory.of(store.schema), store.config
            )
            duplicate = provider.get_store(store.version, store.checkpoint_id)
            self.inner(duplicate, rows)
            duplicate.commit()  # a second attempt's delta for the same version: never committed
            raise RuntimeError("injected task failure after a duplicate attempt committed files")
        return out


def test_failed_and_duplicate_task_attempts(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    flaky = StatefulOperator(
        operator_id=0,
        key_columns=["user"],
        key_schema="user string",
        value_schema="n bigint, total bigint",
        output_schema="user string, n bigint, total bigint",
        update=_Flaky(open_storage(root), failing={0, 2}),
        num_partitions=PARTITIONS,
    )
    # One Spark task per state partition, so that "partition 0's task fails" means one thing.
    query = StatefulQuery(
        "flaky", root, [flaky], catalog_url=sqlite_catalog_url, parallelism=PARTITIONS
    )
    seen: list[tuple[str, int]] = []
    for batch in range(3):
        events = _events(batch)
        seen.extend(events)
        result = query.run_batch(_df(spark, events), batch)
        assert {r.user: (r.n, r.total) for r in result.output.collect()} == {
            u: running_totals(seen)[u] for u in {e[0] for e in events}
        }
        assert all(r.attempt >= 1 for r in result.reports if r.info.store.partition_id in {0, 2})
        result.release()
    assert _state(spark, root, sqlite_catalog_url) == running_totals(seen)
    deltas = list((tmp_path / "ckpt").rglob("*.delta"))
    assert len(deltas) == 3 * PARTITIONS + 3 * 2  # every batch: 2 uncommitted duplicates
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 3 * PARTITIONS
        # The duplicates are found by listing only the retried stores of each batch.
        sweep = sweep_attempts(
            Fleet(catalog, owner="tests"), MaintenancePolicy(), dry_run=False, min_age=timedelta(0)
        )
        assert sweep.intents == 3 and sweep.listed_stores == 3 * 2
        assert len(sweep.recorded) == 3 * 2
        states = catalog.known_paths(query.root)
        assert {states[p] for p in sweep.recorded} == {"orphan"}


def test_driver_dies_after_tasks_committed_before_the_catalog_commit(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "ckpt")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    seen = _events(0) + _events(1)
    first = StatefulQuery("crashy", root, [op], catalog_url=sqlite_catalog_url)
    first.run_batch(_df(spark, _events(0)), 0).release()

    def die(*args: Any, **kwargs: Any) -> None:
        raise CatalogUnavailable("driver lost its connection (injected)")

    with monkeypatch.context() as m:
        m.setattr(Catalog, "commit_batch", die)
        with pytest.raises(CatalogUnavailable):
            first.run_batch(_df(spark, _events(1)), 1)
    # The tasks' delta files of batch 1 exist, but no version 2 is committed.
    assert len(list((tmp_path / "ckpt").rglob("2_*.delta"))) == PARTITIONS
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert {r.version for r in catalog.latest_committed(first.root).values()} == {1}
    # A new driver replays batch 1 from batch 0's committed ids.
    restarted = StatefulQuery("crashy", root, [op], catalog_url=sqlite_catalog_url)
    restarted.run_batch(_df(spark, _events(1)), 1).release()
    assert _state(spark, root, sqlite_catalog_url) == running_totals(seen)
    assert len(list((tmp_path / "ckpt").rglob("2_*.delta"))) == 2 * PARTITIONS
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, restarted.storage) == 2 * PARTITIONS
        # The driver recorded only what it committed; the dead driver's intent never settled,
        # so the attempt sweep lists each store of that batch once and records its deltas.
        assert len(catalog.known_paths(restarted.root)) == 2 * PARTITIONS
        sweep = sweep_attempts(
            Fleet(catalog, owner="tests"), MaintenancePolicy(), dry_run=False, min_age=timedelta(0)
        )
        assert sweep.intents == 1 and sweep.listed_stores == PARTITIONS
        assert len(sweep.recorded) == PARTITIONS
        # The abandoned attempt's deltas are in the inventory: never committed, awaiting cleanup.
        verdicts = {
            v.file.path: v.verdict
            for v in catalog.file_verdicts(RetentionPolicy(), root=restarted.root)
            if v.file.version == 2
        }
        assert len(verdicts) == 2 * PARTITIONS
        assert sorted(verdicts.values()).count(Verdict.NEEDED) == PARTITIONS
        assert all(
            v in {Verdict.NEEDED, Verdict.ORPHAN_IN_GRACE, Verdict.IN_FLIGHT}
            for v in verdicts.values()
        )


def test_a_replayed_batch_replaces_its_commit(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """foreachBatch may run a batch again (the sink failed, the query restarted): the replay
    recomputes from the previous batch's ids and replaces the earlier commit."""
    root = str(tmp_path / "ckpt")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    query = StatefulQuery("replay", root, [op], catalog_url=sqlite_catalog_url)
    query.run_batch(_df(spark, _events(0)), 0).release()
    query.run_batch(_df(spark, _events(1)), 1).release()
    query.run_batch(_df(spark, _events(1)), 1).release()  # the same batch again
    query.run_batch(_df(spark, _events(2)), 2).release()
    assert _state(spark, root, sqlite_catalog_url) == running_totals(
        _events(0) + _events(1) + _events(2)
    )
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 3 * PARTITIONS


def test_structured_streaming_restart_from_checkpoint(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """A file-source stream through foreachBatch; the query stops after a sink failure and is
    restarted from its Spark checkpoint. State equals the reference over all events."""
    source = tmp_path / "events"
    source.mkdir()
    root = str(tmp_path / "ckpt")
    spark_ckpt = str(tmp_path / "spark-checkpoint")
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], PARTITIONS
    )
    all_events: list[tuple[str, int]] = []

    def write_files(first: int, count: int) -> None:
        for i in range(first, first + count):
            events = _events(100 + i, 50)
            all_events.extend(events)
            spark.createDataFrame(events, "user string, amount bigint").coalesce(1).write.json(
                str(source / f"part-{i}")
            )

    # The sink may run in another process (on Connect: the server's foreachBatch worker), so
    # it records the batches it saw as files.
    sunk_dir = tmp_path / "sunk"
    sunk_dir.mkdir()

    def run(fail_at: int | None) -> None:
        def sink(df: DataFrame, batch_id: int) -> None:
            if batch_id == fail_at:
                raise RuntimeError("injected sink failure")
            df.count()
            (sunk_dir / f"{time.time_ns()}-{batch_id}").touch()

        query = StatefulQuery("stream", root, [op], catalog_url=sqlite_catalog_url)
        stream = (
            spark.readStream.schema("user string, amount bigint")
            .option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true")
            .json(str(source))
            .writeStream.foreachBatch(query.foreach_batch(sink))
            .option("checkpointLocation", spark_ckpt)
            .trigger(availableNow=True)
            .start()
        )
        try:
            stream.awaitTermination(300)
        except Exception:
            if fail_at is None:
                raise
        finally:
            stream.stop()

    write_files(0, 3)
    run(fail_at=1)  # batch 1's state commits, then its sink fails and the query stops
    write_files(3, 2)
    run(fail_at=None)  # restart: Spark replays batch 1, then runs the rest
    sunk = [int(p.name.split("-")[1]) for p in sorted(sunk_dir.iterdir())]
    assert sunk[0] == 0 and sorted(set(sunk)) == list(range(5))
    assert _state(spark, root, sqlite_catalog_url) == running_totals(all_events)
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, open_storage(root)) == 5 * PARTITIONS
