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
import sqlite3
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

from state_runtime.catalog import Catalog, FileState, FoundProblem, StoreKey
from state_runtime.cli import main
from state_runtime.errors import (
    BatchOutOfOrder,
    InvalidArgument,
    MaintenanceRefused,
    StateStoreError,
)
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, validate_stores
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
from state_runtime.storage import Storage

pytestmark = [pytest.mark.spark, pytest.mark.slow]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = timedelta(0)


def _events(spark: SparkSession, batch: int) -> DataFrame:
    """40 events of 23 users; event time advances 20 s per batch."""
    return spark.range(batch * 40, batch * 40 + 40).selectExpr(
        "concat('u', cast((id * 7) % 23 as string)) AS user",
        "id % 11 AS amount",
        f"timestamp_seconds({int(T0.timestamp())} + {batch * 20} + id % 17) AS ts",
    )


def _session(event_time: bool) -> Callable[..., Any]:
    """A session per user that closes 30 s after its last event (by the batch clock, or by
    the watermark); the timeout lives in the key's state and must survive a repartition."""

    def step(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState) -> Any:
        if state.has_timed_out:
            n = (state.get() or (0,))[0]
            state.remove()
            return [(key[0], n, True)]
        n = (state.get() or (0,))[0] + len(rows)
        state.update((n,))
        if event_time:
            state.set_timeout_timestamp(max(r[2] for r in rows) + timedelta(seconds=30))
        else:
            state.set_timeout_duration(timedelta(seconds=30))
        return [(key[0], n, False)]

    return step


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
                _session(timeout == "event_time"), n, timeout=timeout,  # type: ignore[arg-type]
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


def _repartition(url: str, root: str | Storage, n: int, spark: SparkSession) -> None:
    with Catalog.open(url) as catalog:
        if isinstance(root, Storage):  # an S3 root with the test's endpoint
            storage = root
            fleet = Fleet(catalog, owner="tests", open_storage=lambda _: storage)
        else:
            fleet = Fleet(catalog, owner="tests")
        plan = repartition(
            spark, fleet, root if isinstance(root, str) else root.uri, "q", n,
            spark_checkpoint="", dry_run=False, idle=NOW,
        )  # fmt: skip
    assert plan.executed and plan.num_partitions == n


def _scenario(
    spark: SparkSession, case: Case, tmp_path: Path, url: str, root: str | Storage
) -> None:
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
    if isinstance(root, str):  # validation reads every retained file: linear, complete, intact
        with Catalog.open(url) as catalog:
            report = validate_stores(Fleet(catalog, owner="tests"), MaintenancePolicy())
            assert report.ok, report.errors


@pytest.mark.parametrize("name", sorted(CASES))
def test_repartitioned_query_equals_one_that_never_changed(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, name: str
) -> None:
    _scenario(spark, CASES[name], tmp_path, sqlite_catalog_url, str(tmp_path / "ckpt"))


@pytest.mark.postgres
def test_on_postgresql(spark: SparkSession, tmp_path: Path, pg_schema: str) -> None:
    Catalog.open(pg_schema, upgrade=True).close()
    _scenario(spark, CASES["running_aggregation"], tmp_path, pg_schema, str(tmp_path / "ckpt"))


@pytest.mark.s3
def test_on_s3(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, s3_storage: Storage
) -> None:
    _scenario(spark, CASES["windowed_aggregation"], tmp_path, sqlite_catalog_url, s3_storage)


@pytest.mark.connect
def test_dry_run_and_cli_figures(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """The command's dry run routes every key (on Spark Connect too, in ``make test``'s second
    pass) and prints rows per new partition and the skew; it changes nothing."""
    runner = Runner(spark, CASES["running_aggregation"], str(tmp_path / "ckpt"), sqlite_catalog_url)
    runner.run("q", 4, range(0, 3))
    with Catalog.open(sqlite_catalog_url) as catalog:
        plan = repartition(
            spark, Fleet(catalog, owner="tests"), str(tmp_path / "ckpt"), "q", 7,
            spark_checkpoint="", idle=NOW,
        )  # fmt: skip
        assert catalog.layouts(catalog.roots()[0])[0, "default"].num_partitions == 4
    assert [f.partition for f in plan.figures] == list(range(7))
    assert sum(f.rows for f in plan.figures) == 23 and not plan.executed
    expected: dict[int, int] = {}
    for user in {f"u{(i * 7) % 23}" for i in range(120)}:
        (p,) = spark.range(1).select(F.pmod(F.hash(F.lit(user)), F.lit(7))).collect()[0]
        expected[p] = expected.get(p, 0) + 1
    assert {f.partition: f.rows for f in plan.figures if f.rows} == expected
    skew = plan.skew(0, "default")
    assert skew is not None and skew == max(expected.values()) / (23 / 7)
    cli = CliRunner(env={"COLUMNS": "200", "STATE_CATALOG_URL": None})
    args = ["--catalog-url", sqlite_catalog_url, "-q", "repartition", str(tmp_path / "ckpt")]
    shown = cli.invoke(
        main, [*args, "--query", "q", "--partitions", "7", "--no-spark-checkpoint", "--idle", "0s"]
    )
    assert shown.exit_code == 0, shown.output
    assert "repartition (dry run)" in shown.output and "--execute to repartition" in shown.output
    assert f"skew {skew:.2f}" in shown.output and "4 -> 7" in shown.output
    from dagster_project.defs.repartition_job import state_repartition_job
    from dagster_project.defs.resources import MaintenanceResource

    config = {"root": str(tmp_path / "ckpt"), "query_id": "q", "partitions": 7, "idle_seconds": 0}
    job = state_repartition_job.execute_in_process(
        run_config={"ops": {"state_repartition": {"config": config}}},
        resources={"maintenance": MaintenanceResource(catalog_url=sqlite_catalog_url)},
    )
    assert job.success
    shown_in_dagster = [
        e.event_specific_data.metadata  # type: ignore[union-attr]
        for e in job.all_events
        if e.event_type_value == "STEP_OUTPUT"
    ]
    assert shown_in_dagster and shown_in_dagster[0]["executed"].value is False
    assert shown_in_dagster[0]["skew_operator_0_default"].value == pytest.approx(skew)


# --- refusals and crashes ---------------------------------------------------------------------


def _layout(url: str, root: str) -> tuple[int, dict[Any, Any]]:
    """The operator's partition count and batch 9's commit entries (what a switch changes)."""
    with Catalog.open(url) as catalog:
        root = catalog.roots()[0] if root not in catalog.roots() else root
        layouts = catalog.layouts(root)
        return layouts[0, "default"].num_partitions, catalog.committed_ids(root, "q", 9)


@pytest.fixture
def ten_batches(spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str) -> Runner:
    """A running aggregation, 10 batches committed on 4 partitions."""
    runner = Runner(spark, CASES["running_aggregation"], str(tmp_path / "ckpt"), sqlite_catalog_url)
    runner.run("q", 4, range(0, 10))
    return runner


def _finish_and_compare(spark: SparkSession, runner: Runner, tmp_path: Path, n: int) -> None:
    """Two more batches on ``n`` partitions; outputs and state equal a query that never
    changed."""
    runner.run("q", n, range(10, 12))
    same = Runner(spark, runner.case, str(tmp_path / "unchanged"), runner.url)
    same.run("same", 4, range(0, 12))
    assert runner.outputs == same.outputs
    ops = runner.case.build(n)
    assert _state(spark, str(runner.root), runner.url, ops) == _state(
        spark, str(tmp_path / "unchanged"), runner.url, ops
    )


def test_refusals_write_nothing(spark: SparkSession, ten_batches: Runner, tmp_path: Path) -> None:
    """A query that just committed, an open validation problem, a lease held by another run,
    a Spark checkpoint behind the catalog: each refused with MaintenanceRefused, nothing
    written (no file, the layout and batch 9's entries unchanged)."""
    url, root = ten_batches.url, str(ten_batches.root)
    before = _layout(url, root)
    files = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    with Catalog.open(url) as catalog:
        fleet = Fleet(catalog, owner="tests")
        canonical = catalog.roots()[0]
        with pytest.raises(MaintenanceRefused, match="looks running"):
            plan_repartition(fleet, root, "q", 7, spark_checkpoint="")
        refused = r"keeps its Spark checkpoint: --(no-)?spark-checkpoint"
        with pytest.raises(MaintenanceRefused, match=refused):
            plan_repartition(fleet, root, "q", 7, spark_checkpoint=None, idle=NOW)
        spark_dir = tmp_path / "spark"
        for name, batches in (("offsets", range(10)), ("commits", range(9))):
            (spark_dir / name).mkdir(parents=True)
            for b in batches:
                (spark_dir / name / str(b)).write_text("v1")
        with pytest.raises(MaintenanceRefused, match="has not committed batch 9"):
            plan_repartition(fleet, root, "q", 7, spark_checkpoint=str(spark_dir), idle=NOW)
        store = next(iter(before[1]))
        catalog.add_problems(StoreKey(canonical, store), [FoundProblem("damaged by hand")])
        with pytest.raises(MaintenanceRefused, match="open validation problem"):
            plan_repartition(fleet, root, "q", 7, spark_checkpoint="", idle=NOW)
        catalog.resolve_problems(StoreKey(canonical, store), "test")
        plan = plan_repartition(fleet, root, "q", 7, spark_checkpoint="", idle=NOW)
        lease = catalog.try_acquire_lease(StoreKey(canonical, store), "other", timedelta(hours=1))
        assert lease is not None
        with pytest.raises(MaintenanceRefused, match="leased by another maintenance run"):
            execute_repartition(spark, fleet, plan, MaintenancePolicy())
        catalog.release_lease(lease)
        with pytest.raises(InvalidArgument, match="already runs on 4"):
            plan_repartition(fleet, root, "q", 4, spark_checkpoint="", idle=NOW)
    assert _layout(url, root) == before
    assert sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file()) == files


def test_failed_catalog_transaction_then_rerun(
    spark: SparkSession, ten_batches: Runner, tmp_path: Path
) -> None:
    """The switch transaction fails (a real database error from a trigger): the old layout
    stays whole, the snapshots written are recorded as uncommitted files; the rerun switches
    and the query continues on 7 partitions."""
    url, root = ten_batches.url, str(ten_batches.root)
    before = _layout(url, root)
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        db.execute(
            "CREATE TRIGGER fail_switch BEFORE INSERT ON operator_layouts "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
    with pytest.raises(StateStoreError, match="injected failure"):
        _repartition(url, root, 7, spark)
    assert _layout(url, root) == before
    with Catalog.open(url) as catalog:
        canonical = catalog.roots()[0]
        written = [
            f
            for p in range(7)
            for f in catalog.store_files(canonical, StoreId(0, p))
            if f.kind.value == "snapshot"
        ]
        assert len(written) == 7 and {f.state for f in written} == {FileState.WRITTEN}
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        db.execute("DROP TRIGGER fail_switch")
    _repartition(url, root, 7, spark)
    assert _layout(url, root)[0] == 7
    _finish_and_compare(spark, ten_batches, tmp_path, 7)


def test_failed_task_then_rerun(spark: SparkSession, ten_batches: Runner, tmp_path: Path) -> None:
    """A task cannot write its partition's snapshot (a file stands where the store's folder
    must go): the job fails, the old layout stays; the rerun finishes."""
    url, root = ten_batches.url, str(ten_batches.root)
    before = _layout(url, root)
    blocker = tmp_path / "ckpt" / "state" / "0" / "5"
    blocker.write_text("not a folder")
    with pytest.raises(Exception, match="5"):
        _repartition(url, root, 7, spark)
    assert _layout(url, root) == before
    blocker.unlink()
    _repartition(url, root, 7, spark)
    _finish_and_compare(spark, ten_batches, tmp_path, 7)


@pytest.mark.parametrize("when", ["snapshots written", "early"])
def test_killed_process_then_rerun(
    spark: SparkSession, ten_batches: Runner, tmp_path: Path, when: str
) -> None:
    """``statestore repartition --execute`` in a real process, killed (SIGKILL) early or once
    the new snapshots are in storage: the catalog shows the old layout or the new one, never
    a mix; run again, the command finishes (or finds the work done) and the query continues."""
    url, root = ten_batches.url, str(ten_batches.root)
    before = _layout(url, root)
    args = [
        sys.executable, "-c", "from state_runtime.cli import entry; entry()",
        "--catalog-url", url, "-q", "repartition", root, "--query", "q", "--partitions", "7",
        "--no-spark-checkpoint", "--idle", "0s", "--execute",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    process = subprocess.Popen(args, env=env, start_new_session=True)
    try:
        started = time.monotonic()
        while time.monotonic() < started + 300 and process.poll() is None:
            if when == "early" and time.monotonic() > started + 10:
                break
            if when != "early" and list((tmp_path / "ckpt" / "state").rglob("11_*.snapshot")):
                break
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    count, entries = _layout(url, root)
    if count == 4:
        assert entries == before[1]
    else:
        assert count == 7 and {r.version for r in entries.values()} == {11}
        assert len(entries) == 7
    if count == 4:
        _repartition(url, root, 7, spark)
    _finish_and_compare(spark, ten_batches, tmp_path, 7)


def test_the_batch_the_repartition_switched_at_is_refused_before_any_task(
    spark: SparkSession, ten_batches: Runner, tmp_path: Path
) -> None:
    """Batch 9, which the repartition switched at (its state is now the new layout's
    snapshots), run again on the new layout: refused by the driver's order check with
    BatchOutOfOrder naming the batch and the repartition, before any task runs (no file
    written, the sink never called, batch 9's entries unchanged); batch 10 then runs."""
    url, root = ten_batches.url, str(ten_batches.root)
    _repartition(url, root, 7, spark)
    before = _layout(url, root)
    files = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    query = StatefulQuery("q", root, ten_batches.case.build(7), catalog_url=url)
    called: list[int] = []
    with pytest.raises(BatchOutOfOrder) as refused:
        query.run_batch(_events(spark, 9), 9, sink=lambda _, b: called.append(b))
    message = str(refused.value)
    assert "batch 9 of query q" in message and "repartition run" in message, message
    assert "7 partitions" in message, message
    assert called == [] and _layout(url, root) == before
    assert sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file()) == files
    _finish_and_compare(spark, ten_batches, tmp_path, 7)
