"""The driver side of a stateful query: one micro-batch at a time, committed atomically.

For batch ``b`` the driver reads batch ``b - 1``'s committed checkpoint ids from the catalog
and ships them to the tasks; each task opens its partition's store at exactly that checkpoint,
applies the batch and commits a new delta; the driver collects the tasks' checkpoint infos and
commits all partitions of all operators in one catalog transaction. A replayed batch
recomputes from ``b - 1``'s ids, so every store's lineage stays linear. The stateful stage is
computed once: its output is cached and handed to the sink from the cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from state_runtime.catalog import BatchMetrics, Catalog
from state_runtime.catalog import catalog_url as default_catalog_url
from state_runtime.checkpoint import CheckpointInfo
from state_runtime.errors import CommitConflict, InvalidArgument
from state_runtime.identity import StoreId, validate_name
from state_runtime.runtime.event_time import EventTimeClock, event_time_metrics
from state_runtime.runtime.operator import CHECKPOINT_COLUMN, StatefulOperator
from state_runtime.runtime.tasks import (
    PARTITION_COLUMN,
    TaskSpec,
    base_refs,
    parse_report,
    run_partition,
)
from state_runtime.runtime.watermark import BatchWatermarks, Watermark
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage, open_storage

log = logging.getLogger("state_runtime.runtime")

Sink = Callable[[DataFrame, int], None]


@dataclass
class BatchResult:
    """One committed batch: its output (cached, computed once) and what it cost."""

    batch_id: int
    output: DataFrame
    infos: list[CheckpointInfo]
    metrics: BatchMetrics
    reports: list[dict[str, Any]] = field(repr=False, default_factory=list)
    _cached: list[DataFrame] = field(repr=False, default_factory=list)

    def release(self) -> None:
        """Drop the cached stateful output (after the sink has consumed it)."""
        for df in self._cached:
            df.unpersist()
        self._cached.clear()


class StatefulQuery:
    """A streaming query's stateful operators, their checkpoint root and the catalog.

    ``operators`` run in order, each on the previous one's output (the first on the batch's
    input). ``checkpoint_root`` is a path or URI, or a :class:`Storage` (for example an
    S3Storage with an endpoint override); it travels to the executors with each task. Use
    :meth:`run_batch` directly, or :meth:`foreach_batch` with Structured Streaming's
    ``foreachBatch`` so that any source works.
    """

    def __init__(
        self,
        query_id: str,
        checkpoint_root: str | Storage,
        operators: Sequence[StatefulOperator],
        *,
        catalog_url: str | None = None,
        watermark: Watermark | None = None,
    ) -> None:
        self.query_id = validate_name(query_id, "query id")
        if not operators:
            raise InvalidArgument("a stateful query needs at least one operator")
        ids = [(op.operator_id, op.store_name) for op in operators]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"operators must have distinct (operator id, store name): {ids}")
        self.storage = (
            checkpoint_root
            if isinstance(checkpoint_root, Storage)
            else open_storage(checkpoint_root)
        )
        self.root = self.storage.uri
        self.operators = list(operators)
        self.event_time = EventTimeClock.of(watermark, self.operators)
        self.catalog_url = catalog_url or default_catalog_url()
        self.catalog = Catalog.open(self.catalog_url, upgrade=True)
        self._registered = False

    # --- query start --------------------------------------------------------------------

    def _register(self) -> None:
        """Register every store; refuse a changed partition count for an existing operator."""
        known = self.catalog.stores(self.root)
        for op in self.operators:
            existing = {
                s.key.store.partition_id
                for s in known
                if s.key.store.operator_id == op.operator_id
                and s.key.store.store_name == op.store_name
            }
            if existing and existing != set(range(op.num_partitions)):
                raise InvalidArgument(
                    f"operator {op.operator_id} (store {op.store_name}) of query {self.query_id} "
                    f"has {len(existing)} state partitions in the catalog; it cannot run with "
                    f"{op.num_partitions}. Keep num_partitions={len(existing)}, or start a new "
                    "query with a new checkpoint root"
                )
            for partition in range(op.num_partitions):
                if partition not in existing:
                    self.catalog.register_store(
                        self.root,
                        StoreId(op.operator_id, partition, op.store_name),
                        op.schema.key.jsonValue(),
                        op.schema.value.jsonValue(),
                    )
        self._registered = True

    def _committed_before(self, batch_id: int) -> dict[StoreId, Any]:
        if batch_id == 0:
            return {}
        previous = self.catalog.committed_ids(self.root, self.query_id, batch_id - 1)
        if previous:
            return previous
        ours = {
            store: ref
            for store, ref in self.catalog.latest_committed(self.root).items()
            if any(store.operator_id == op.operator_id for op in self.operators) and ref.version
        }
        if ours:
            raise CommitConflict(
                f"batch {batch_id - 1} of query {self.query_id} is not committed in the catalog, "
                f"but its stores already have committed versions (e.g. {next(iter(ours.items()))})"
                ": the query's Spark checkpoint and the state catalog disagree"
            )
        return {}

    # --- one batch ----------------------------------------------------------------------

    def _stage(
        self,
        df: DataFrame,
        op: StatefulOperator,
        batch_id: int,
        committed: dict[StoreId, Any],
        batch_time_ms: int,
        watermarks: BatchWatermarks | None,
    ) -> DataFrame:
        missing = [c for c in op.key_columns if c not in df.columns]
        if missing:
            raise InvalidArgument(f"key columns {missing} are not in the input: {df.columns}")
        keys = [F.col(c) for c in op.key_columns]
        routed = df.withColumn(
            PARTITION_COLUMN, F.pmod(F.hash(*keys), F.lit(op.num_partitions))
        ).repartition(op.num_partitions, *keys)
        spec = TaskSpec(
            storage=self.storage,
            catalog_url=self.catalog_url,
            query_id=self.query_id,
            batch_id=batch_id,
            operator=op,
            base=base_refs(committed, op),
            input_schema=to_arrow_schema(routed.schema, timezone="UTC"),
            batch_time_ms=batch_time_ms,
            worker_settings=WorkerSettings.from_env(),
            event_time=self.event_time.spec(watermarks, first=op is self.operators[0]),
        )
        return routed.mapInArrow(partial(run_partition, spec), op.staged_schema())

    def run_batch(
        self,
        df: DataFrame,
        batch_id: int,
        *,
        sink: Sink | None = None,
        batch_time_ms: int | None = None,
    ) -> BatchResult:
        """Run and commit batch ``batch_id``. Call ``release()`` on the result when done.

        With ``sink``, the output is handed to ``sink(output, batch_id)`` before the catalog
        commit: the sink's first action computes the stateful stage (once; it is cached) and
        the checkpoint infos are then read from the cache, which saves a Spark job per batch.
        If the driver fails in between, the replayed batch recomputes and the sink sees the
        output again: at-least-once, as with any ``foreachBatch`` sink. ``batch_time_ms``
        (default: now) is the batch's clock for timeouts, the same in every task.
        """
        started = time.perf_counter()
        batch_time = int(time.time() * 1000) if batch_time_ms is None else batch_time_ms
        if not self._registered:
            self._register()
        committed = self._committed_before(batch_id)
        watermarks = self.event_time.watermark_for(self.catalog, self.root, self.query_id, batch_id)
        current, cached, reports = df, [], []
        try:
            for op in self.operators:
                staged = self._stage(current, op, batch_id, committed, batch_time, watermarks)
                staged.persist(StorageLevel.MEMORY_AND_DISK)
                cached.append(staged)
                current = staged.where(F.col(CHECKPOINT_COLUMN).isNull()).drop(CHECKPOINT_COLUMN)
            if sink is not None:
                sink(current, batch_id)
            for op, staged in zip(self.operators, cached, strict=True):
                rows = staged.where(F.col(CHECKPOINT_COLUMN).isNotNull()).collect()
                op_reports = [parse_report(r[CHECKPOINT_COLUMN]) for r in rows]
                self._check_reports(op, op_reports)
                reports.extend(op_reports)
            self.event_time.record(self.catalog, self.root, self.query_id, batch_id, reports)
            infos = [CheckpointInfo.from_dict(r) for r in reports]
            commit_started = time.perf_counter()
            self.catalog.commit_batch(self.root, self.query_id, batch_id, infos)
            commit_ms = (time.perf_counter() - commit_started) * 1000
        except BaseException:
            for staged in cached:
                staged.unpersist()
            raise
        metrics = self._metrics(reports, commit_ms, (time.perf_counter() - started) * 1000)
        metrics.extra.update(event_time_metrics(reports, watermarks))
        self.catalog.record_batch_metrics(self.root, self.query_id, batch_id, metrics)
        log.info(
            "query %s batch %d committed: %d rows in, %d keys updated, %d state rows, "
            "%d bytes written, commit %.1f ms, cache %d hits / %d misses",
            self.query_id,
            batch_id,
            metrics.rows_in,
            metrics.keys_updated,
            metrics.state_rows,
            metrics.bytes_written,
            metrics.commit_ms,
            metrics.cache_hits,
            metrics.cache_misses,
        )
        return BatchResult(batch_id, current, infos, metrics, reports, cached)

    def _check_reports(self, op: StatefulOperator, reports: list[dict[str, Any]]) -> None:
        partitions = sorted(r["partition_id"] for r in reports)
        if partitions != list(range(op.num_partitions)):
            raise CommitConflict(
                f"operator {op.operator_id} returned checkpoints for partitions {partitions}, "
                f"expected exactly 0..{op.num_partitions - 1}"
            )

    @staticmethod
    def _metrics(reports: list[dict[str, Any]], commit_ms: float, batch_ms: float) -> BatchMetrics:
        hits = sum(1 for r in reports if r["cache_hit"])
        return BatchMetrics(
            rows_in=sum(r["rows_in"] for r in reports),
            keys_updated=sum(r["keys_updated"] for r in reports),
            state_rows=sum(r["rows"] for r in reports),
            bytes_written=sum(r["bytes_written"] for r in reports),
            commit_ms=commit_ms,
            cache_hits=hits,
            cache_misses=len(reports) - hits,
            extra={
                "batch_ms": batch_ms,
                "max_task_ms": max((r["task_ms"] for r in reports), default=0.0),
                "deltas_applied": sum(r["deltas_applied"] for r in reports),
                "repairs": [x for r in reports for x in r["repairs"]],
            },
        )

    # --- Structured Streaming -----------------------------------------------------------

    def foreach_batch(self, sink: Sink | None = None) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function: run the batch, hand its output to
        ``sink(output_df, batch_id)`` (computed once, served from cache), commit."""

        def process(df: DataFrame, batch_id: int) -> None:
            self.run_batch(df, batch_id, sink=sink).release()

        return process
