"""Dagster's partitions page at fleet size: one dynamic partition per store, PostgreSQL storage.

    make bench-dagster-partitions                       # 20,000 partitions
    STATE_BENCH_PARTITIONS=20000,100000 make bench-dagster-partitions
    STATE_BENCH_PG=postgresql://user@host:5432 python benchmarks/bench_dagster_partitions.py

For each size: a Dagster instance on PostgreSQL (its own database, dropped at the end) with that
many ``state_stores`` partitions (the time to add them, as the discovery sensor's one request
does), each materialized once (as the first health run reports them, written in chunks of 500),
and the time to list them (``get_dynamic_partitions``, what a sensor reads); then the two
GraphQL queries the asset's Partitions page makes, through the real code location served over
gRPC: the partition keys, and the partitions' statuses. *Cold* is the first query (Dagster
computes its partition status cache from the event log), *warm* the next one (the cache is
current).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import AssetMaterialization, DagsterEvent, DagsterEventType, DagsterInstance
from dagster._core.events import StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from dagster._core.test_utils import instance_for_test
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql
from fresh_database import fresh_database

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.partitions import state_stores

DATABASE = "state_dagster_partitions_bench"
DEFINITIONS = str(Path(__file__).resolve().parent.parent / "dagster_project" / "definitions.py")
KEYS = """
query Keys($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { partitionKeysByDimension { name partitionKeys } }
  }
}"""
STATUSES = """
query Statuses($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses {
          materializedPartitions failedPartitions unmaterializedPartitions materializingPartitions
        }
      }
    }
  }
}"""


def materialize_all(instance: DagsterInstance, names: list[str]) -> None:
    """One runless materialization per partition, 500 per write."""
    for start in range(0, len(names), 500):
        instance.event_log_storage.store_event_batch(
            [
                EventLogEntry(  # type: ignore[no-untyped-call]
                    user_message="",
                    level=20,
                    job_name=RUNLESS_JOB_NAME,
                    run_id=RUNLESS_RUN_ID,
                    error_info=None,
                    timestamp=time.time(),
                    dagster_event=DagsterEvent(
                        event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
                        job_name=RUNLESS_JOB_NAME,
                        event_specific_data=StepMaterializationData(
                            AssetMaterialization(state_checkpoints.key, partition=name)
                        ),
                    ),
                )
                for name in names[start : start + 500]
            ]
        )


def timed(context: object, query: str) -> tuple[float, Mapping[str, Any]]:
    started = time.perf_counter()
    result = execute_dagster_graphql(
        context,  # type: ignore[arg-type]
        query,
        {"key": {"path": state_checkpoints.key.path}},
    )
    assert not result.errors, result.errors
    return time.perf_counter() - started, result.data


def bench(server: str, size: int) -> None:
    names = [f"query-{q}/0/{p}/default" for q in range(size // 200) for p in range(200)]
    with (
        fresh_database(server, DATABASE) as url,
        instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}}) as instance,
    ):
        started = time.perf_counter()
        instance.add_dynamic_partitions(state_stores.name or "", names)
        added = time.perf_counter() - started
        materialize_all(instance, names)
        filled = time.perf_counter() - started - added
        started = time.perf_counter()
        assert len(instance.get_dynamic_partitions(state_stores.name or "")) == size
        listed = time.perf_counter() - started
        with define_out_of_process_context(DEFINITIONS, "defs", instance) as context:
            keys_cold, found = timed(context, KEYS)
            keys_warm, _ = timed(context, KEYS)
            statuses_cold, statuses = timed(context, STATUSES)
            statuses_warm, _ = timed(context, STATUSES)
        node = found["assetNodeOrError"]
        assert isinstance(node, dict)
        assert len(node["partitionKeysByDimension"][0]["partitionKeys"]) == size
        ranges = statuses["assetNodeOrError"]
        assert isinstance(ranges, dict)
        materialized = ranges["assetPartitionStatuses"]["materializedPartitions"]
        assert len(materialized) == size, len(materialized)
    print(
        f"{size:>7,} partitions: added {added:6.1f} s, materialized {filled:6.1f} s, "
        f"listed {listed:5.2f} s | keys cold {keys_cold:6.2f} s, warm {keys_warm:6.2f} s | "
        f"statuses cold {statuses_cold:6.2f} s, warm {statuses_warm:6.2f} s"
    )


def main() -> None:
    server = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
    sizes = [int(s) for s in os.environ.get("STATE_BENCH_PARTITIONS", "20000").split(",")]
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for size in sizes:
        bench(server, size)


if __name__ == "__main__":
    main()
