"""Spreading the snapshot pass over a Spark cluster, for fleets of very many stores.

The driver asks the catalog which stores are due and deals them into slices; each Spark task
opens the catalog by URL and the storage by root (nothing is shipped but names and settings)
and runs the ordinary snapshot pass over its slice, under the same per-store leases, as one
recorded run. Outcomes come back to the driver as plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog
from state_runtime.maintenance.fleet import Fleet, format_store_key, parse_store_key
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.snapshots import due_for_snapshot, snapshot_pass


def _snapshot_slice(
    url: str, policy: MaintenancePolicy, owner: str, keys: Iterable[str]
) -> Iterator[dict[str, Any]]:
    wanted = [parse_store_key(k) for k in keys]
    if not wanted:
        return
    with Catalog.open(url) as catalog:
        report = snapshot_pass(Fleet(catalog, owner=owner), policy, only=wanted)
    for o in report.outcomes:
        yield {
            "store": format_store_key(o.key),
            "status": o.status.value,
            "run_id": report.run_id,
            "bytes": o.bytes,
            "error": o.error,
        }


def snapshot_on_spark(
    spark: SparkSession,
    fleet: Fleet,
    catalog_url: str,
    policy: MaintenancePolicy,
    *,
    slices: int | None = None,
) -> list[dict[str, Any]]:
    """Snapshot the fleet's due stores in Spark tasks; one outcome dict per store."""
    due = [format_store_key(d.record.key) for d in due_for_snapshot(fleet, policy)]
    if not due:
        return []
    count = slices or spark.sparkContext.defaultParallelism
    owner = f"{fleet.owner}:spark"
    rdd = spark.sparkContext.parallelize(due, max(1, min(count, len(due))))
    return rdd.mapPartitions(
        lambda keys: _snapshot_slice(catalog_url, policy, owner, keys)
    ).collect()
