"""Maintenance passes spread over a Spark cluster, for fleets of very many stores.

:class:`SparkSpread` is the :class:`~state_runtime.maintenance.spread.Spread` of the
snapshot, validation and cleanup passes (``statestore maintain|validate --on-spark``, the
Dagster resource's ``on_spark``). The driver (the process that calls the pass) computes what
is due or planned, records the pass's one run and builds its report, as on one host; the
items (due stores, stores with their sample draws, chunks of stores to clean) are pickled
into a DataFrame, dealt into slices by ``repartition``, and each Spark task opens the
catalog by URL and the storage by root (nothing is shipped but names and settings) and runs
the pass's ordinary per-store work over its slice, under the same per-store leases and the
driver's run id. What each store's work returned comes back to the driver as Arrow batches
of pickled results. DataFrames and ``mapInArrow`` only, so it runs on a classic and on a
Spark Connect session alike; on Connect the tasks run on the server's executors, which must
reach the catalog and the storage (and have this package installed).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession

from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.spread import Work, worker_fleet
from state_runtime.runtime.spark_kind import default_parallelism

Item = TypeVar("Item")
Result = TypeVar("Result")

RESULT_BATCH = 256
"""Results a task sends back per Arrow batch."""
TASK_WORKERS = 2
"""Worker threads a Spark task runs by default: its catalog pool holds these plus
:data:`~state_runtime.maintenance.workers.RESERVED_CONNECTIONS`, so a pass asking more is
lowered to it (with a warning). Spark's parallelism is the slices; slices x workers
connections are open at once, which PostgreSQL's ``max_connections`` must hold."""

_RESULT = pa.schema([("result", pa.binary())])


@dataclass(frozen=True)
class SparkSpread:
    """Deals a pass's items to ``slices`` Spark tasks (default: the session's parallelism);
    each opens the catalog at ``catalog_url``."""

    spark: SparkSession
    catalog_url: str
    slices: int | None = None
    task_workers: int = TASK_WORKERS

    def map(
        self,
        fleet: Fleet,
        items: Sequence[Item],
        work: Work[Item, Result],
    ) -> Iterator[Result]:
        if not items:
            return
        count = max(1, min(self.slices or default_parallelism(self.spark), len(items)))
        rows = [(pickle.dumps(item),) for item in items]
        dealt = self.spark.createDataFrame(rows, "item binary").repartition(count)
        roots = None if fleet.roots is None else list(fleet.roots)
        task = partial(_task, self.catalog_url, self.task_workers, roots, fleet.owner, work)
        # toArrow runs every task at once (toLocalIterator would run them one by one) and
        # keeps the results as the compact pickled batches the tasks sent
        table = dealt.mapInArrow(task, "result binary").toArrow()
        for chunk in table.column("result").chunks:
            for value in chunk.to_pylist():
                yield pickle.loads(value)


def _task(
    url: str,
    workers: int,
    roots: list[str] | None,
    owner: str,
    work: Work[Item, Result],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """One Spark task: its slice's work on a fleet of its own
    (:func:`~state_runtime.maintenance.spread.worker_fleet`), the results sent back
    :data:`RESULT_BATCH` a batch."""
    items: list[Item] = [pickle.loads(v) for b in batches for v in b.column(0).to_pylist()]
    if not items:
        return
    with worker_fleet(url, workers, roots, owner) as fleet:
        pending: list[bytes] = []
        for result in work(fleet, items):
            pending.append(pickle.dumps(result))
            if len(pending) == RESULT_BATCH:
                yield _batch(pending)
                pending = []
        if pending:
            yield _batch(pending)


def _batch(results: list[bytes]) -> pa.RecordBatch:
    """Pickled results as one Arrow batch of :data:`_RESULT`."""
    return pa.RecordBatch.from_arrays([pa.array(results, pa.binary())], schema=_RESULT)
