"""The driver commits a batch from its task reports: two catalog transactions per batch
whatever the number of partitions, no task opens the catalog, and the files of attempts the
driver never hears of (a killed task, a zombie writing after the commit) are found by the
attempt sweep, which lists only the stores those attempts touched."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog, FileState
from state_runtime.maintenance import Fleet, MaintenancePolicy, sweep_attempts
from state_runtime.runtime import Agg, StatefulOperator, StatefulQuery, running_aggregation, worker
from state_runtime.runtime.aggregation import _RunningAggregate
from state_runtime.runtime.tasks import TaskSpec
from state_runtime.storage import Storage, open_storage
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_store import StateStore

from .reference import assert_lineage_linear

pytestmark = [pytest.mark.spark, pytest.mark.connect]
NOW = timedelta(0)


def _events(seed: int, n: int = 200) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(50)}", rng.randrange(100)) for _ in range(n)]


def _df(spark: SparkSession, events: list[tuple[str, int]]) -> DataFrame:
    return spark.createDataFrame(events, "user string, amount bigint").repartition(2)


@contextmanager
def _transactions(catalog: Catalog) -> Iterator[list[str]]:
    """Every transaction begun on the catalog's engine (the driver's) inside the block."""
    begun: list[str] = []

    def count(connection: sa.engine.Connection) -> None:
        begun.append("begin")

    sa.event.listen(catalog.engine, "begin", count)
    try:
        yield begun
    finally:
        sa.event.remove(catalog.engine, "begin", count)


def _states(catalog: Catalog, root: str) -> dict[str, str]:
    return {path: state for path, state in catalog.known_paths(root).items()}


def test_two_catalog_transactions_per_batch_whatever_the_partitions(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    # Tasks carry no catalog address: they cannot open the catalog.
    assert not {f.name for f in fields(TaskSpec)} & {"catalog_url", "catalog_timeouts"}
    for partitions in (2, 24):
        root = str(tmp_path / f"ckpt-{partitions}")
        op = running_aggregation(0, ["user"], "user string", [Agg("n", "count")], partitions)
        query = StatefulQuery(f"q{partitions}", root, [op], catalog_url=sqlite_catalog_url)
        query.run_batch(_df(spark, _events(0)), 0).release()  # registers the stores
        for batch in (1, 2):
            with _transactions(query.catalog) as begun:
                result = query.run_batch(_df(spark, _events(batch)), batch)
            result.release()
            assert len(begun) == 2, (partitions, batch)  # begin_batch and commit_batch
        with Catalog.open(sqlite_catalog_url) as catalog:
            files = _states(catalog, query.root)
            written = {str(p.relative_to(root)) for p in Path(root).rglob("*.delta")}
            assert set(files) == written  # every file recorded, by the driver (idle: none)
            assert set(files.values()) == {FileState.COMMITTED}
            holders = catalog.store_holders(query.root)
            assert len(holders) == partitions and {r.version for _, r in holders.values()} == {3}
            metrics = catalog.batch_metrics(query.root, f"q{partitions}")
            assert sorted(m.batch_id for m in metrics) == [0, 1, 2]
            # A normal batch leaves nothing to sweep.
            assert catalog.attempt_sweeps(catalog.now() + timedelta(days=1)) == []


class _Killed:
    """The real aggregation; the first attempt of partition ``victim`` writes its delta, then
    its Python worker dies (``os._exit``): a file no report will ever name. With ``zombie``
    the worker forks a child first that writes one more delta for the same version after
    ``delay_s`` (a zombie attempt writing after the batch committed)."""

    def __init__(self, storage: Storage, victim: int, zombie_after_s: float | None) -> None:
        self.inner = _RunningAggregate(
            ("user",), (Agg("n", "count"), Agg("total", "sum", "amount"))
        )
        self.storage = storage
        self.victim = victim
        self.zombie_after_s = zombie_after_s

    def _write_copy(self, store: StateStore, rows: pa.Table) -> None:
        provider = worker.provider_for(
            self.storage, store.store_id, SchemaHistory.of(store.schema), store.config
        )
        copy = provider.get_store(store.version, store.checkpoint_id)
        self.inner(copy, rows)
        copy.commit()

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.attemptNumber() == 0 and store.store_id.partition_id == self.victim:
            if self.zombie_after_s is not None and os.fork() == 0:
                time.sleep(self.zombie_after_s)
                self._write_copy(store, rows)
                os._exit(0)
            self._write_copy(store, rows)
            os._exit(1)  # the Python worker dies: Spark retries the task
        return self.inner(store, rows)


def _query(root: str, url: str, victim: int, zombie_after_s: float | None) -> StatefulQuery:
    op = StatefulOperator(
        operator_id=0,
        key_columns=["user"],
        key_schema="user string",
        value_schema="n bigint, total bigint",
        output_schema="user string, n bigint, total bigint",
        update=_Killed(open_storage(root), victim, zombie_after_s),
        num_partitions=4,
    )
    return StatefulQuery("killed", root, [op], catalog_url=url, parallelism=4)


def test_a_killed_task_attempt_file_is_found_by_listing_one_store(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    query = _query(root, sqlite_catalog_url, victim=1, zombie_after_s=None)
    result = query.run_batch(_df(spark, _events(0)), 0)
    assert {r.info.store.partition_id for r in result.reports if r.attempt > 0} == {1}
    result.release()
    killed = [p for p in (tmp_path / "ckpt").rglob("1_*.delta") if "/0/1/" in str(p)]
    assert len(killed) == 2  # the killed attempt's and the retry's
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert len(_states(catalog, query.root)) == 4  # the driver never heard of the first
        fleet = Fleet(catalog, owner="tests")
        policy = MaintenancePolicy()
        # Inside the grace nothing is swept: the batch's attempts might still be running.
        early = sweep_attempts(fleet, policy, dry_run=False)
        assert early.intents == 0 and early.listed_stores == 0
        report = sweep_attempts(fleet, policy, dry_run=False, min_age=NOW)
        assert report.intents == 1 and report.listed_stores == 1  # partition 1 only
        assert len(report.recorded) == 1
        files = _states(catalog, query.root)
        assert files[report.recorded[0]] == FileState.ORPHAN
        assert sorted(files.values()).count(FileState.COMMITTED) == 4
        # Swept once: a later pass lists nothing.
        again = sweep_attempts(fleet, policy, dry_run=False, min_age=NOW)
        assert again.intents == 0 and again.listed_stores == 0
        assert assert_lineage_linear(catalog, query.storage) == 4


def test_a_zombie_write_after_the_commit_is_found(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    query = _query(root, sqlite_catalog_url, victim=2, zombie_after_s=3.0)
    events = _events(0)
    result = query.run_batch(_df(spark, events), 0)
    result.release()
    folder = tmp_path / "ckpt" / "state" / "0" / "2" / "default"
    with Catalog.open(sqlite_catalog_url) as catalog:
        fleet = Fleet(catalog, owner="tests")
        deadline = time.monotonic() + 120
        while len(list(folder.glob("1_*.delta"))) < 3:  # retry, killed attempt, zombie
            assert time.monotonic() < deadline, "the zombie never wrote"
            time.sleep(0.5)
        committed = catalog.committed_ids(query.root, "killed", 0)
        report = sweep_attempts(fleet, MaintenancePolicy(), dry_run=False, min_age=NOW)
        assert report.listed_stores == 1 and len(report.recorded) == 2
        files = _states(catalog, query.root)
        assert {files[p] for p in report.recorded} == {FileState.ORPHAN}
        assert catalog.committed_ids(query.root, "killed", 0) == committed
        assert assert_lineage_linear(catalog, query.storage) == 4
