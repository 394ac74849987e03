"""Maintenance of a ``transform_with_state`` query (value, list and map variables and timers,
each variable its own store of the operator): a repartition moves every variable's store and
the timers, routed by key; a restore returns every store of the operator to the same batch;
validation, cleanup, the health view and Dagster's store names treat each variable's store as
any other. Real Spark, real files, SQLite and PostgreSQL catalogs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from dagster_project.defs.metadata import store_table
from state_runtime.catalog import Catalog
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    StoreNames,
    cleanup_pass,
    store_reports,
    validate_stores,
)
from state_runtime.maintenance.repartition import repartition
from state_runtime.maintenance.restore import plan_restore, restore_query
from state_runtime.runtime import StatefulOperator, StatefulQuery, read_state, transform_with_state
from state_runtime_airflow.results import health_result

pytestmark = pytest.mark.spark
VARIABLES = ("count", "amounts", "seen")
STORES = (*VARIABLES, "tws-timers")
T0_MS = 1_767_225_600_000
Rows = list[tuple[Any, ...]]


class Everything(StatefulProcessor):
    """A key's count (value), its amounts (list) and how often each amount came (map); a
    processing-time timer 30 s after the key's last rows reports the key and clears it."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n bigint")
        self.amounts = handle.getListState("amounts", "amount bigint")
        self.seen = handle.getMapState("seen", "amount bigint", "times bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        amounts = [int(a) for frame in rows for a in frame["amount"]]
        (n,) = self.count.get() or (0,)
        self.count.update((n + len(amounts),))
        self.amounts.appendList([(a,) for a in amounts])
        for a in amounts:
            (times,) = self.seen.getValue((a,)) or (0,)
            self.seen.updateValue((a,), (times + 1,))
        for pending in list(self.handle.listTimers()):
            self.handle.deleteTimer(pending)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 30_000)
        kinds = len(list(self.seen.keys()))
        yield pd.DataFrame({"user": [key[0]], "n": [n + len(amounts)], "kinds": [kinds]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, info: Any) -> Iterator[pd.DataFrame]:
        n = len(list(self.amounts.get()))
        self.count.clear()
        self.amounts.clear()
        self.seen.clear()
        yield pd.DataFrame({"user": [key[0]], "n": [n], "kinds": [-1]})


def _operator(partitions: int) -> StatefulOperator:
    return transform_with_state(
        0, ["user"], "user string", Everything(), "user string, n bigint, kinds bigint",
        partitions, time_mode="ProcessingTime",
    )  # fmt: skip


def _events(spark: SparkSession, batch: int) -> DataFrame:
    """Five rows of four of eleven users: a user idle for a batch has its timer fire."""
    rows = [(f"u{(batch * 4 + i) % 11}", (batch + i) % 3) for i in range(4)] + [("u0", batch % 2)]
    return spark.createDataFrame(rows, "user string, amount bigint")


def _rows(df: DataFrame) -> Rows:
    return sorted((tuple(r) for r in df.collect()), key=repr)


class Run:
    """One query on ``root``, batch by batch with a fixed clock (20 s a batch); each batch's
    output kept. Each :meth:`run` is a new query object on the catalog."""

    def __init__(self, spark: SparkSession, root: str, url: str, query: str = "q") -> None:
        self.spark, self.root, self.url, self.query = spark, root, url, query
        self.outputs: dict[int, Rows] = {}

    def run(self, partitions: int, batches: range) -> None:
        query = StatefulQuery(self.query, self.root, [_operator(partitions)], catalog_url=self.url)
        for b in batches:
            result = query.run_batch(_events(self.spark, b), b, batch_time_ms=T0_MS + b * 20_000)
            self.outputs[b] = _rows(result.output)
            result.release()

    def state(self) -> dict[str, Rows]:
        """Every store of the operator, as ``read_state`` reads it."""
        return {
            name: _rows(
                read_state(self.spark, self.root, 0, name, catalog_url=self.url).select(
                    "key", "value"
                )
            )
            for name in STORES
        }


def _fleet_check(url: str, root: str, partitions: int) -> None:
    """Validation finds every store sound, cleanup deletes within retention and leaves it
    sound, the health view lists every variable's store by its name."""
    policy = MaintenancePolicy(snapshot_min_deltas=2)
    with Catalog.open(url) as catalog:
        fleet = Fleet(catalog, owner="tests")
        report = validate_stores(fleet, policy)
        assert report.ok, report.errors
        cleaned = cleanup_pass(fleet, policy, dry_run=False, now=None)
        assert not cleaned.counts().get("failed_files"), cleaned.rows()
        assert validate_stores(fleet, policy).ok
        reports = store_reports(fleet, policy)
        names = StoreNames.of(catalog)
        [catalog_root] = [r for r in catalog.roots() if r.endswith(Path(root).name)]
        shown = {names.name(r.key) for r in reports if r.key.root == catalog_root}
        expected = {f"q/0/{p}/{s}" for p in range(partitions) for s in STORES}
        assert expected <= shown, sorted(shown)
        assert {r.status.status.value for r in reports} == {"healthy"}
        table = store_table(reports, names).value  # Dagster's state_store_health table
        assert expected <= {row.data["store"] for row in table.records}
    airflow = {  # Airflow's health task: one row per store, by its full key
        row["store"].rpartition("#")[2]: row["status"]
        for row in health_result(reports)["stores"]
        if row["store"].startswith(f"{catalog_root}#")
    }
    stores = [f"0/{p}/{s}" for p in range(partitions) for s in STORES]
    assert {store: airflow.get(store) for store in stores} == dict.fromkeys(stores, "healthy")


def test_repartition_moves_every_variable_and_the_timers(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """3 partitions for 2 batches, 2 for 2 more: outputs (a timer set before the switch fires
    after it) and every store equal those of the query that never changed."""
    changed = Run(spark, str(tmp_path / "ckpt"), sqlite_catalog_url)
    changed.run(3, range(0, 2))
    with Catalog.open(sqlite_catalog_url) as catalog:
        plan = repartition(
            spark, Fleet(catalog, owner="tests"), changed.root, "q", 2,
            spark_checkpoint="", dry_run=False, idle=timedelta(0),
        )  # fmt: skip
        assert plan.executed
        moved = {m.store_name for m in plan.moves}
    assert moved == set(STORES)
    changed.run(2, range(2, 4))
    same = Run(spark, str(tmp_path / "same"), sqlite_catalog_url, "same")
    same.run(3, range(0, 4))
    assert changed.outputs == same.outputs
    assert ("u5", 1, -1) in changed.outputs[3]
    assert changed.state() == same.state()
    _fleet_check(sqlite_catalog_url, changed.root, 2)


@pytest.mark.postgres
def test_restore_returns_every_store_of_the_operator_to_the_batch(
    spark: SparkSession, tmp_path: Path, pg_schema: str
) -> None:
    """Four batches, a restore to batch 1, batches 2 and 3 again from a new query object: the
    same outputs and every store as before. A variable's store that no longer loads starts
    again from empty with every store of its operator and partition."""
    Catalog.open(pg_schema, upgrade=True).close()
    first = Run(spark, str(tmp_path / "ckpt"), pg_schema)
    first.run(2, range(0, 4))
    state = first.state()
    with Catalog.open(pg_schema) as catalog:
        fleet, root = Fleet(catalog, owner="tests"), catalog.roots()[0]
        plan = plan_restore(fleet, root, "q", 1, spark_checkpoint="")
        assert sorted(s.store_name for s in plan.targets) == sorted(STORES * 2)
        restore_query(fleet, plan, MaintenancePolicy())
    again = Run(spark, first.root, pg_schema)
    again.run(2, range(2, 4))
    assert again.outputs == {b: first.outputs[b] for b in (2, 3)}
    assert again.state() == state
    for lost in (tmp_path / "ckpt" / "state" / "0" / "1" / "seen").iterdir():
        lost.unlink()
    with Catalog.open(pg_schema) as catalog:
        fleet = Fleet(catalog, owner="tests")
        plan = plan_restore(fleet, root, "q", 3, spark_checkpoint="", allow_lost_state=True)
    assert sorted((k.store.partition_id, k.store.store_name) for k in plan.restarted) == sorted(
        (1, s) for s in STORES
    )
