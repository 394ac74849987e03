"""Maintenance on stores produced by real Structured Streaming runs (the runtime, on Spark).

The stream reads JSON files one per micro-batch and keeps a running count and sum per user in
``state_runtime`` stores through ``foreachBatch``; the Dagster assets and checks then run on
what it wrote, and a maintenance loop runs beside a stream while it commits batch after batch.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetSelection, DagsterInstance, materialize
from pyspark.sql import SparkSession

from dagster_project.defs.asset_checks import state_checkpoint_checks
from dagster_project.defs.assets import (
    state_checkpoints,
    state_retention_cleanup,
    state_snapshots,
    state_store_health,
)
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    cleanup_pass,
    run_checks,
    snapshot_pass,
)
from state_runtime.maintenance.spark import SparkSpread
from state_runtime.runtime import Agg, StatefulQuery, read_state, running_aggregation
from tests.dagster.conftest import resources_for
from tests.maintenance.streams import StoreStream
from tests.runtime.reference import running_totals

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

PARTITIONS = 3
FAST = MaintenancePolicy(
    snapshot_min_deltas=4,
    retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(hours=1)),
    min_window=timedelta(0),
)


class FileStream:
    """A streaming query over a folder of JSON files, one file per micro-batch."""

    def __init__(self, spark: SparkSession, tmp: Path, url: str) -> None:
        self.spark, self.url = spark, url
        self.source = tmp / "events"
        self.source.mkdir()
        self.root = str(tmp / "ckpt")
        self.spark_checkpoint = str(tmp / "spark-checkpoint")
        self.events: list[tuple[str, int]] = []
        self.files = 0
        op = running_aggregation(
            0,
            ["user"],
            "user string",
            [Agg("n", "count"), Agg("total", "sum", "amount")],
            PARTITIONS,
        )
        self.query = StatefulQuery("clicks", self.root, [op], catalog_url=url)

    def add_files(self, count: int) -> None:
        for _ in range(count):
            rng = random.Random(self.files)
            events = [(f"user{rng.randrange(30)}", rng.randrange(100)) for _ in range(40)]
            self.events.extend(events)
            self.spark.createDataFrame(events, "user string, amount bigint").coalesce(1).write.json(
                str(self.source / f"part-{self.files:04d}")
            )
            self.files += 1

    def run(self) -> None:
        """Process every file not yet processed, one batch per file."""
        stream = (
            self.spark.readStream.schema("user string, amount bigint")
            .option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true")
            .json(str(self.source))
            .writeStream.foreachBatch(self.query.foreach_batch(lambda df, _: df.count()))
            .option("checkpointLocation", self.spark_checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            stream.awaitTermination(300)
        finally:
            stream.stop()

    def state(self) -> dict[str, tuple[int, int]]:
        rows = read_state(self.spark, self.root, 0, catalog_url=self.url).collect()
        return {r.key.user: (r.value.n, r.value.total) for r in rows}


def metadata(result: Any, key: str) -> dict[str, Any]:
    [event] = result.asset_materializations_for_node(key)
    return {name: value.value for name, value in event.metadata.items()}


def test_assets_and_checks_on_stores_of_a_real_stream(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    stream = FileStream(spark, tmp_path, sqlite_catalog_url)
    stream.add_files(4)
    stream.run()
    with Catalog.open(sqlite_catalog_url) as catalog, DagsterInstance.ephemeral() as instance:
        resources = resources_for(catalog, FAST)
        snaps = materialize([state_snapshots], resources=resources, instance=instance)
        assert metadata(snaps, "state_snapshots")["written"] == PARTITIONS
        stream.add_files(2)
        stream.run()  # the stream goes on from the snapshots' versions
        run_config = {"ops": {"state_retention_cleanup": {"config": {"dry_run": False}}}}
        clean = materialize(
            [state_retention_cleanup], resources=resources, instance=instance, run_config=run_config
        )
        # versions 6 and 5 load from the snapshot at 4: deltas 1..4 go
        assert metadata(clean, "state_retention_cleanup")["deleted_files"] == 4 * PARTITIONS
        health = materialize([state_store_health], resources=resources, instance=instance)
        figures = metadata(health, "state_store_health")
        assert figures["stores"] == PARTITIONS and figures["max_deltas_since_snapshot"] == 2
        checks = materialize(
            [state_checkpoints, state_checkpoint_checks],
            selection=AssetSelection.checks_for_assets(state_checkpoints.key),
            resources=resources,
            instance=instance,
        )
        results = {e.check_name: e.passed for e in checks.get_asset_check_evaluations()}
        assert results == {
            "lineage_valid": True,
            "retention_within_policy": True,
            "snapshot_lag": True,
            "orphan_growth": True,
        }
    assert stream.state() == running_totals(stream.events)


def test_maintenance_beside_a_running_stream(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Snapshots and an aggressive cleanup loop while the stream commits 8 batches: every
    batch loads its state, the result equals the reference, nothing needed is deleted. The
    last 2 batches wait until the loop has made two passes and deleted files (however slow
    the machine), so they run beside a cleanup that has really removed what they left."""
    stream = FileStream(spark, tmp_path, sqlite_catalog_url)
    stream.add_files(6)
    stop = threading.Event()
    cleaned = threading.Event()  # two passes made and files deleted (or the loop failed)
    errors: list[BaseException] = []
    passes = 0

    def maintain() -> None:
        nonlocal passes
        with Catalog.open(sqlite_catalog_url) as catalog:
            fleet = Fleet(catalog, owner="beside-the-stream")
            while not stop.is_set():
                try:
                    snapshot_pass(fleet, FAST)
                    cleanup_pass(fleet, FAST, dry_run=False)
                    passes += 1
                except BaseException as exc:
                    errors.append(exc)
                    cleaned.set()
                    return
                if passes >= 2 and catalog.deletion_history(root=stream.query.root, limit=1):
                    cleaned.set()
                stop.wait(0.2)

    worker = threading.Thread(target=maintain)
    worker.start()
    try:
        stream.run()
        assert cleaned.wait(120), "no deletion in 120 s of maintenance beside the stream"
        assert not errors, errors
        stream.add_files(2)
        stream.run()
    finally:
        stop.set()
        worker.join()
    assert not errors and passes >= 2
    assert stream.state() == running_totals(stream.events)
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert catalog.deletion_history(root=stream.query.root), "cleanup ran beside the stream"
        report = run_checks(Fleet(catalog), FAST)
        assert report.validation.ok, report.validation.errors
        latest = catalog.latest_committed(stream.query.root)
        assert {ref.version for ref in latest.values()} == {8}


def test_the_resource_runs_the_passes_on_spark(
    spark: SparkSession, make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """``on_spark``: the snapshot asset and the validation checks run their passes as Spark
    tasks (the fixture's session), with the outcome and the one recorded run of each."""
    stream = make_stream()
    stream.run(5)
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    maintenance = MaintenanceResource.of(FAST, catalog_url=url, on_spark=True)
    assert isinstance(maintenance.spread(), SparkSpread)
    resources = {"maintenance": maintenance}
    snaps = materialize([state_snapshots], resources=resources, instance=instance)
    assert metadata(snaps, "state_snapshots")["written"] == len(stream.stores)
    checks = materialize(
        [state_checkpoints, state_checkpoint_checks],
        selection=AssetSelection.checks_for_assets(state_checkpoints.key),
        resources=resources,
        instance=instance,
    )
    assert all(e.passed for e in checks.get_asset_check_evaluations())
    kinds = [r.kind for r in stream.catalog.recent_runs()]
    assert sorted(kinds) == ["snapshot", "validate"]
