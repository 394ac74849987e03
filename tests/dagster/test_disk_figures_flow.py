"""The operator's view of state on local disk, end to end: batches run through the real task
body (the simulation's platform, without Spark) with a budget that puts the stores' runs on
local disk; each batch's resident bytes, bytes on local disk, block-cache hits and misses and
compaction bytes are the sums of its tasks' reports, recorded in the catalog (SQLite and
PostgreSQL), shown by its views, in the figures Spark's progress carries, and in the
metadata of Dagster's batch events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster import AssetKey, AssetMaterialization, DagsterInstance, build_sensor_context

from dagster_project.defs.catalog_events import catalog_events_sensor
from state_runtime.catalog import DISK_FIGURES, BatchMetrics, Catalog, Position
from state_runtime.runtime.spark_progress import SPARK_NAMES, figures
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.disk_runs import LOCAL_DISK
from tests.catalog.settled import settled
from tests.dagster.conftest import resources_for
from tests.orchestrator_catalog import BOTH_CATALOGS
from tests.simulation.platform import QUERY, Platform

KEYS = 12_000
BATCHES = 3


@pytest.fixture
def disk_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 256 KiB worker budget (runs past 64 KiB go to disk, the block cache holds 64 KiB)
    in 1 KiB blocks, the runs in the test's folder."""
    saved = CACHE.budget, LOCAL_DISK.block_bytes
    monkeypatch.setenv("STATE_CACHE_BYTES", str(256 << 10))
    LOCAL_DISK.block_bytes = 1024
    LOCAL_DISK.set_directory(str(tmp_path / "local"))
    try:
        yield
    finally:
        set_budget(saved[0])
        LOCAL_DISK.block_bytes = saved[1]
        LOCAL_DISK.set_directory(None)


@BOTH_CATALOGS
def test_disk_figures_reach_the_catalog_spark_progress_and_dagster(
    tmp_path: Path, catalog: Catalog, instance: DagsterInstance, disk_budget: None
) -> None:
    platform = Platform(tmp_path / "platform", partitions=2, catalog_url=catalog.url)
    try:
        reported = {}
        for batch in range(BATCHES):
            changes = {p: {f"k{i:05d}": 1 for i in range(p, KEYS, 2)} for p in range(2)}
            reports = platform.run_batch(batch, changes)
            reported[batch] = {
                name: sum(getattr(r, name) for r in reports) for name in DISK_FIGURES
            }
    finally:
        platform.close()
    recorded = {r.batch_id: r.metrics for r in catalog.batch_metrics(platform.root, QUERY)}
    assert sorted(recorded) == list(range(BATCHES))
    for batch, metrics in recorded.items():
        assert {name: getattr(metrics, name) for name in DISK_FIGURES} == reported[batch]
        assert 0 < metrics.resident_bytes < metrics.local_disk_bytes  # fences, not rows
        shown = figures(batch, metrics)  # what Spark's progress carries, under Spark's names
        assert {spark: shown[spark] for spark, _ in SPARK_NAMES} == {
            spark: getattr(metrics, name) for spark, name in SPARK_NAMES
        }
    # the first batch only wrote; the next ones read every key (one get each) and fold
    # their changes into the base
    assert recorded[0].block_cache_hits == recorded[0].block_cache_misses == 0
    assert all(recorded[b].block_cache_hits > 0 for b in range(1, BATCHES))
    assert all(recorded[b].block_cache_misses > 0 for b in range(1, BATCHES))
    assert all(recorded[b].compaction_bytes > 0 for b in range(1, BATCHES))

    _views_show(catalog, recorded)
    _dagster_shows(catalog, instance, recorded)


def _views_show(catalog: Catalog, recorded: dict[int, BatchMetrics]) -> None:
    columns = ", ".join(DISK_FIGURES)
    for view in ("state_batch_metrics", "read_batch_metrics"):
        with catalog.engine.connect() as connection:
            rows = connection.execute(sa.text(f"SELECT batch_id, {columns} FROM {view}"))
            shown = {r.batch_id: r._asdict() for r in rows}
        for batch, metrics in recorded.items():
            assert {name: shown[batch][name] for name in DISK_FIGURES} == {
                name: getattr(metrics, name) for name in DISK_FIGURES
            }, view


def _dagster_shows(
    catalog: Catalog, instance: DagsterInstance, recorded: dict[int, BatchMetrics]
) -> None:
    settled(lambda: catalog.batch_metrics_after(Position()), BATCHES)  # PostgreSQL: readable
    context = build_sensor_context(instance=instance, resources=resources_for(catalog))
    catalog_events_sensor(context)  # reports each batch itself
    found = instance.fetch_materializations(AssetKey("state_batch_metrics"), limit=100)
    events = [r.asset_event for r in found.records]
    assert len(events) == BATCHES
    for event in events:
        assert isinstance(event, AssetMaterialization)
        metrics = recorded[event.metadata["batch"].value]
        label = event.metadata["query"].value
        for name in DISK_FIGURES:
            assert event.metadata[f"{label}/{name}"].value == getattr(metrics, name)
