"""Spreading the snapshot pass over a Spark cluster, for fleets of very many stores.

The driver asks the catalog which stores are due and deals them into slices; each Spark task
opens the catalog by URL and the storage by root (nothing is shipped but names and settings)
and runs the ordinary snapshot pass over its slice, under the same per-store leases, as one
recorded run. Outcomes come back to the driver as rows. DataFrames and ``mapInArrow`` only, so
it runs on a classic and on a Spark Connect session alike; on Connect the tasks run on the
server's executors, which must reach the catalog and the storage.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from state_runtime.catalog import Catalog
from state_runtime.maintenance.fleet import Fleet, format_store_key, parse_store_key
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.snapshots import due_for_snapshot, snapshot_pass
from state_runtime.runtime.spark_kind import default_parallelism

_OUTCOME = pa.schema(
    [
        ("store", pa.string()),
        ("status", pa.string()),
        ("run_id", pa.int64()),
        ("bytes", pa.int64()),
        ("error", pa.string()),
    ]
)


def _snapshot_slice(
    url: str, policy: MaintenancePolicy, owner: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    wanted = [parse_store_key(k) for b in batches for k in b.column("store").to_pylist()]
    if not wanted:
        return
    with Catalog.open(url) as catalog:
        report = snapshot_pass(Fleet(catalog, owner=owner), policy, only=wanted)
    yield pa.RecordBatch.from_pylist(
        [
            {
                "store": format_store_key(o.key),
                "status": o.status.value,
                "run_id": report.run_id,
                "bytes": o.bytes,
                "error": o.error,
            }
            for o in report.outcomes
        ],
        schema=_OUTCOME,
    )


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
    count = max(1, min(slices or default_parallelism(spark), len(due)))
    owner = f"{fleet.owner}:spark"
    keys = spark.createDataFrame([(k,) for k in due], "store string").repartition(count)
    slice_ = partial(_snapshot_slice, catalog_url, policy, owner)
    rows = keys.mapInArrow(slice_, from_arrow_schema(_OUTCOME))
    return [row.asDict() for row in rows.collect()]
