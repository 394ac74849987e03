"""``read_state_changes``: the change feed equals the differences of consecutive versions,
and a batch whose deltas maintenance deleted gives a typed error."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import ChangesCleanedUp, InvalidArgument
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass, snapshot_pass
from state_runtime.runtime import (
    StatefulQuery,
    Watermark,
    Window,
    read_state,
    read_state_changes,
)

from .test_event_time import _batch_events, _df, _windowed

pytestmark = [pytest.mark.spark, pytest.mark.connect]

Key = tuple[Any, ...]


def _versions(spark: SparkSession, root: str, url: str, batch_id: int) -> dict[Key, Any]:
    rows = read_state(spark, root, 0, catalog_url=url, query_id="feed", batch_id=batch_id)
    return {(r.partition_id, tuple(r.key)): tuple(r.value) for r in rows.collect()}


def test_change_feed_equals_the_differences_of_consecutive_versions(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    url = sqlite_catalog_url
    query = StatefulQuery(
        "feed",
        root,
        [_windowed("append", Window(timedelta(seconds=10)))],  # evictions are deletes
        catalog_url=url,
        watermark=Watermark("ts", timedelta(seconds=5)),
    )
    rng = random.Random(3)
    batches = 7
    catalog = Catalog.open(url)
    fleet, policy = Fleet(catalog, owner="tests"), MaintenancePolicy(snapshot_min_deltas=5)
    for batch_id in range(batches):
        query.run_batch(_df(spark, _batch_events(rng, batch_id)), batch_id).release()
        if batch_id == 4:
            snapshot_pass(fleet, policy)  # snapshots version 5: deltas 1..5 become superseded

    feed = read_state_changes(spark, root, 0, 0, batches - 1, catalog_url=url).collect()
    assert {r.batch_id for r in feed} == set(range(batches))
    previous: dict[Key, Any] = {}
    deletes = 0
    for batch_id in range(batches):
        current = _versions(spark, root, url, batch_id)
        changed = {k: v for k, v in current.items() if previous.get(k) != v}
        removed = set(previous) - set(current)
        rows = [r for r in feed if r.batch_id == batch_id]
        assert {
            (r.partition_id, tuple(r.key)): tuple(r.value)
            for r in rows
            if r.change_type == "update"
        } == changed, batch_id
        assert {(r.partition_id, tuple(r.key)) for r in rows if r.change_type == "delete"} == (
            removed
        ), batch_id
        assert all(r.value is None for r in rows if r.change_type == "delete")
        deletes += len(removed)
        previous = current
    assert deletes > 0
    one = read_state_changes(spark, root, 0, 3, 3, catalog_url=url).collect()
    assert sorted(map(tuple, one)) == sorted(tuple(r) for r in feed if r.batch_id == 3)

    with pytest.raises(InvalidArgument, match="not committed"):
        read_state_changes(spark, root, 0, batches - 1, batches, catalog_url=url)

    # Cleanup deletes the deltas the snapshot supersedes: batches 0..4 (versions 1..5).
    later = datetime.now(UTC) + timedelta(days=1)
    assert cleanup_pass(fleet, policy, now=later, dry_run=False).deleted
    catalog.close()
    with pytest.raises(ChangesCleanedUp, match="batch 0 of operator 0") as err:
        read_state_changes(spark, root, 0, 0, batches - 1, catalog_url=url)
    assert err.value.path is not None and err.value.path.endswith(".delta")
    kept = read_state_changes(spark, root, 0, batches - 1, batches - 1, catalog_url=url)
    assert sorted(map(tuple, kept.collect())) == sorted(
        tuple(r) for r in feed if r.batch_id == batches - 1
    )
