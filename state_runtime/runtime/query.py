"""The driver side of a stateful query: one micro-batch at a time, committed atomically.

For batch ``b`` the driver checks the batch against the catalog (schemas, order), reads batch
``b - 1``'s committed checkpoint ids and ships them to the tasks; each task opens its
partitions' stores at exactly those checkpoints, applies the batch, commits new deltas and
reports them as rows of the stage's output. The driver commits all partitions of all operators
in one catalog transaction. A replayed batch recomputes from ``b - 1``'s ids, so every store's
lineage stays linear.

On the normal path a batch is one Spark job: the sink's action runs the stateful stage, whose
output (report rows filtered out) feeds the sink directly, and an observation of the stage
collects the reports on the way (no cache, no second action). When the observation is
missing or incomplete (the sink ran no action, took a few rows, or ran an action whose
metrics do not come back), one more job reads the reports from the stage's data. A sink that
runs several actions says so with ``cache_output=True``; otherwise each action recomputes the
stage and writes duplicate deltas, which the commit ignores (it picks one checkpoint per
partition; the rest are orphans that cleanup removes). The same code runs on a classic and a
Spark Connect session (``spark_kind.py`` holds the few differences).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType

from state_runtime.catalog import BatchMetrics, Catalog, CatalogTimeouts
from state_runtime.catalog import catalog_url as default_catalog_url
from state_runtime.errors import (
    BatchOutOfOrder,
    CatalogError,
    CommitConflict,
    InvalidArgument,
    SchemaMismatch,
)
from state_runtime.identity import CheckpointRef, StoreId, validate_name
from state_runtime.runtime.event_time import EventTimeClock, event_time_metrics
from state_runtime.runtime.loss import lost_state
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.query_check import check_query
from state_runtime.runtime.spark_kind import (
    default_parallelism,
    observation,
    observed,
    session_mark,
)
from state_runtime.runtime.spark_progress import publish
from state_runtime.runtime.tasks import (
    HEARTBEAT_COLUMN,
    PARTITION_COLUMN,
    REPORT_COLUMN,
    TaskReport,
    TaskSpec,
    base_refs,
    run_partitions,
)
from state_runtime.runtime.times import SESSION_TIME_ZONE_CONF
from state_runtime.runtime.watermark import BatchWatermarks, Watermark
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage, open_storage
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.schema_history import SchemaEntry, SchemaHistory

log = logging.getLogger("state_runtime.runtime")

Sink = Callable[[DataFrame, int], None]
ADAPTIVE_CONF = "spark.sql.adaptive.enabled"


@dataclass
class BatchResult:
    """One committed batch: its output, the task reports committed and what it cost.

    ``output`` is cached (computed once) when the batch ran without a sink or with
    ``cache_output=True``; call :meth:`release` when done with it.
    """

    batch_id: int
    output: DataFrame
    infos: list[CheckpointInfo]
    metrics: BatchMetrics
    reports: list[TaskReport] = field(repr=False, default_factory=list)
    _cached: list[DataFrame] = field(repr=False, default_factory=list)

    def release(self) -> None:
        """Drop the cached stateful output (after the sink has consumed it)."""
        for df in self._cached:
            df.unpersist()
        self._cached.clear()


def _quoted(column: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + column.replace("`", "``") + "`"


class StatefulQuery:
    """A streaming query's stateful operators, their checkpoint root and the catalog.

    ``operators`` run in order, each on the previous one's output (the first on the batch's
    input). ``checkpoint_root`` is a path or URI, or a :class:`Storage` (for example an
    S3Storage with an endpoint override); it travels to the executors with each task. Use
    :meth:`run_batch` directly, or :meth:`foreach_batch` with Structured Streaming's
    ``foreachBatch`` so that any source works. ``adaptive`` sets Spark's adaptive query
    execution for the batch's plan (default off: with it, Spark runs the input shuffle as a
    job of its own and re-plans between the jobs, which costs more than it saves here; see
    docs/runtime.md); None leaves the session's setting alone. ``parallelism`` is how many
    Spark tasks run an operator's state partitions in a batch (each task handles its share of
    them one after another): by default the session's default parallelism (its cores), never
    more than the partitions, so that a batch runs in one wave of tasks. ``progress=True``
    shows each committed batch's figures in the streaming query's progress when the stream
    was observed with :func:`with_state_progress` (one more small job per batch; see
    ``spark_progress.py``).
    """

    def __init__(
        self,
        query_id: str,
        checkpoint_root: str | Storage,
        operators: Sequence[StatefulOperator],
        *,
        catalog_url: str | None = None,
        adaptive: bool | None = False,
        watermark: Watermark | None = None,
        parallelism: int | None = None,
        progress: bool = False,
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
        self._catalog: Catalog | None = Catalog.open(self.catalog_url, upgrade="sqlite")
        self.adaptive = adaptive
        if parallelism is not None and (
            isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1
        ):
            raise InvalidArgument(f"parallelism={parallelism!r}: expected a positive number")
        self.parallelism = parallelism
        self.progress = progress
        self._registered = False
        self._histories: dict[tuple[int, str], SchemaHistory] = {}
        self._beats: dict[int, tuple[str, DataFrame]] = {}

    @property
    def catalog(self) -> Catalog:
        """The catalog, opened in the process that runs the driver logic: the one that built
        the query, or the one its ``foreach_batch`` function was shipped to (on Spark Connect,
        the server's foreachBatch worker), which must reach the catalog too."""
        if self._catalog is None:
            self._catalog = Catalog.open(self.catalog_url, upgrade="sqlite")
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (``foreach_batch`` travels to a Connect server's Python worker): the
        catalog's engine and the session-bound plans stay behind and are rebuilt there."""
        return {**self.__dict__, "_catalog": None, "_beats": {}, "_registered": False}

    # --- query start --------------------------------------------------------------------

    def _register(self, batch_id: int) -> None:
        """Register every store and record each operator's schema history; refuse a changed
        partition count or a schema change the planner refuses (before any task runs)."""
        known = self.catalog.stores(self.root)
        existing: dict[tuple[int, str], set[int]] = {}
        for record in known:
            store = record.key.store
            existing.setdefault((store.operator_id, store.store_name), set()).add(
                store.partition_id
            )
        for op in self.operators:
            found = existing.get((op.operator_id, op.store_name), set())
            if found and found != set(range(op.num_partitions)):
                raise InvalidArgument(
                    f"operator {op.operator_id} (store {op.store_name}) of query {self.query_id} "
                    f"has {len(found)} state partitions in the catalog; it cannot run with "
                    f"{op.num_partitions}. Keep num_partitions={len(found)}, or start a new "
                    "query with a new checkpoint root"
                )
        histories = self._planned_histories(batch_id)
        for op in self.operators:
            key = (op.operator_id, op.store_name)
            for partition in sorted(set(range(op.num_partitions)) - existing.get(key, set())):
                self.catalog.register_store(
                    self.root,
                    StoreId(op.operator_id, partition, op.store_name),
                    op.schema.key.jsonValue(),
                    op.schema.value.jsonValue(),
                )
            self.catalog.record_schema_history(
                self.root, op.operator_id, op.store_name, histories[key]
            )
            self._histories[key] = histories[key]
        self._registered = True

    def _planned_histories(self, batch_id: int) -> dict[tuple[int, str], SchemaHistory]:
        """Each operator's schema history with its declared schema as the newest, planned
        against the catalog's (SchemaMismatch naming every refused field, before anything is
        written or any task runs)."""
        recorded = self.catalog.schema_histories(self.root)
        planned = {}
        for op in self.operators:
            key = (op.operator_id, op.store_name)
            known = recorded.get(key)
            if known is None:
                planned[key] = SchemaHistory((SchemaEntry.make(op.schema, from_batch=batch_id),))
                continue
            try:
                planned[key], _ = known.evolve(op.schema, op.schema_change, batch_id)
            except SchemaMismatch as e:
                raise SchemaMismatch(
                    f"query {self.query_id}, operator {op.operator_id} (store {op.store_name}): "
                    f"{e.reason}",
                    path=self.root,
                ) from None
        return planned

    def _committed_before(self, batch_id: int) -> dict[StoreId, CheckpointRef]:
        """Batch ``batch_id - 1``'s committed ids; refuse a batch out of order (older than the
        last committed one, or after a gap) before any task runs."""
        last = self.catalog.commit_history(self.root, query_id=self.query_id, limit=1)
        if last and batch_id < last[0].batch_id:
            raise BatchOutOfOrder(
                f"batch {batch_id} of query {self.query_id} is older than its last committed "
                f"batch {last[0].batch_id}: only the last batch may run again (a replay)",
                store=last[0].key.store,
            )
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
            raise BatchOutOfOrder(
                f"batch {batch_id - 1} of query {self.query_id} is not committed in the catalog, "
                f"but its stores already have committed versions (e.g. {next(iter(ours.items()))})"
                f"; last committed batch: {last[0].batch_id if last else None}. The query's "
                "Spark checkpoint and the state catalog disagree"
            )
        return {}

    # --- one batch ----------------------------------------------------------------------

    def _routed(
        self, df: DataFrame, columns: list[str], op: StatefulOperator, tasks: int
    ) -> DataFrame:
        """The input with each row's state partition, plus one heartbeat row per partition,
        shuffled so that Spark partition ``p`` holds state partitions ``p, p + tasks, ...``.

        Built in few Py4J calls (each call, and each new DataFrame's analysis, costs the driver
        milliseconds per batch). Key columns are named with ``F.col`` of a quoted name: exact,
        whatever the name holds, never a regex (as a backquoted name inside a SQL string would
        be under ``spark.sql.parser.quotedRegexColumnNames``)."""
        missing = [c for c in op.key_columns if c not in columns]
        if missing:
            raise InvalidArgument(f"key columns {missing} are not in the input: {columns}")
        reserved = {PARTITION_COLUMN, HEARTBEAT_COLUMN} & set(columns)
        if reserved:
            raise InvalidArgument(f"input column names {sorted(reserved)} are reserved")
        keys = [F.col(_quoted(c)) for c in op.key_columns]
        data = df.select(
            "*",
            F.pmod(F.hash(*keys), F.lit(op.num_partitions)).alias(PARTITION_COLUMN),
            F.lit(False).alias(HEARTBEAT_COLUMN),
        )
        # The heartbeats' input columns are null (filled in by the union).
        routed = data.unionByName(self._heartbeats(df.sparkSession, op), allowMissingColumns=True)
        return routed.repartitionById(tasks, PARTITION_COLUMN)

    def _heartbeats(self, spark: SparkSession, op: StatefulOperator) -> DataFrame:
        """One row per state partition of ``op``, built once per Spark session and partition
        count (see ``spark_kind.session_mark``)."""
        mark = session_mark(spark)
        cached = self._beats.get(op.num_partitions)
        if cached is not None and cached[0] == mark:
            return cached[1]
        beats = spark.range(0, op.num_partitions, 1, 1).selectExpr(
            f"CAST(id AS INT) AS {PARTITION_COLUMN}", f"true AS {HEARTBEAT_COLUMN}"
        )
        self._beats[op.num_partitions] = (mark, beats)
        return beats

    def _tasks(self, spark: SparkSession, op: StatefulOperator) -> int:
        """Spark tasks for an operator's state partitions: ``parallelism``, or the session's
        default parallelism (its cores), never more than the partitions."""
        slots = self.parallelism or default_parallelism(spark)
        return max(1, min(op.num_partitions, slots))

    def _stage(
        self,
        df: DataFrame,
        schema: StructType,
        op: StatefulOperator,
        batch_id: int,
        run: str,
        committed: dict[StoreId, CheckpointRef],
        batch_time_ms: int,
        watermarks: BatchWatermarks | None,
    ) -> tuple[DataFrame, StructType]:
        """``op``'s stateful stage over ``df`` (whose schema is ``schema``: each ``.schema``
        call is one analysis of the plan, so the batch's input is analysed once) and its
        output schema, the next operator's input schema."""
        if op is self.operators[0] and REPORT_COLUMN in schema.names:
            raise InvalidArgument(f"input column name {REPORT_COLUMN!r} is reserved")
        routed = self._routed(df, schema.names, op, self._tasks(df.sparkSession, op))
        input_schema = StructType(
            [
                *schema.fields,
                StructField(PARTITION_COLUMN, IntegerType()),
                StructField(HEARTBEAT_COLUMN, BooleanType()),
            ]
        )
        spec = TaskSpec(
            storage=self.storage,
            catalog_url=self.catalog_url,
            query_id=self.query_id,
            batch_id=batch_id,
            run=run,
            operator=op,
            schema_history=self._histories[op.operator_id, op.store_name],
            base=base_refs(committed, op),
            input_schema=to_arrow_schema(input_schema, timezone="UTC"),
            batch_time_ms=batch_time_ms,
            worker_settings=WorkerSettings.from_env(),
            catalog_timeouts=CatalogTimeouts.from_env(),
            event_time=self.event_time.spec(watermarks, first=op is self.operators[0]),
            time_zone=df.sparkSession.conf.get(SESSION_TIME_ZONE_CONF) or "UTC",
        )
        out = op.output_nullable().add(StructField(REPORT_COLUMN, StringType(), True))
        return routed.mapInArrow(partial(run_partitions, spec), out), out

    @contextmanager
    def _adaptive(self, spark: SparkSession) -> Iterator[None]:
        """Run the batch's actions with this query's adaptive setting, then restore it."""
        if self.adaptive is None:
            yield
            return
        before = spark.conf.get(ADAPTIVE_CONF) or "true"
        spark.conf.set(ADAPTIVE_CONF, str(self.adaptive).lower())
        try:
            yield
        finally:
            spark.conf.set(ADAPTIVE_CONF, before)

    def run_batch(
        self,
        df: DataFrame,
        batch_id: int,
        *,
        sink: Sink | None = None,
        cache_output: bool = False,
        batch_time_ms: int | None = None,
    ) -> BatchResult:
        """Run and commit batch ``batch_id``. Call ``release()`` on the result when done.

        With ``sink``, the output is handed to ``sink(output, batch_id)`` before the catalog
        commit, and the sink's action runs the stateful stage: one Spark job. Pass
        ``cache_output=True`` if the sink runs several actions on the output (it is then
        cached, computed once). Without a sink the output is cached and computed here, for
        the caller to use after the commit. If the driver fails between the sink and the
        commit, the replayed batch recomputes and the sink sees the output again:
        at-least-once, as with any ``foreachBatch`` sink. ``batch_time_ms`` (default: now) is
        the batch's clock for timeouts, the same in every task.
        """
        started = time.perf_counter()
        schema = df.schema  # the batch's one analysis of its input
        check_query(self.operators, self.event_time.watermark, schema)
        batch_time = int(time.time() * 1000) if batch_time_ms is None else batch_time_ms
        if not self._registered:
            self._register(batch_id)
        committed = self._committed_before(batch_id)
        watermarks = self.event_time.watermark_for(self.catalog, self.root, self.query_id, batch_id)
        spark = df.sparkSession
        run = uuid.uuid4().hex
        staged = df
        for op in self.operators:
            staged, schema = self._stage(
                staged, schema, op, batch_id, run, committed, batch_time, watermarks
            )
        channel = observation()
        staged = staged.observe(channel, F.collect_list(REPORT_COLUMN).alias("reports"))
        cached = [staged.persist(StorageLevel.MEMORY_AND_DISK)] if cache_output or not sink else []
        output = staged.filter(F.col(REPORT_COLUMN).isNull()).drop(REPORT_COLUMN)
        try:
            with self._adaptive(spark):
                if sink is not None:
                    sink(output, batch_id)
                reports = self._mine(run, observed(channel).get("reports") or [])
                chosen = self._choose(reports)
                if chosen is None:  # no sink, or its actions did not bring every report back
                    notes = staged.filter(F.col(REPORT_COLUMN).isNotNull()).select(REPORT_COLUMN)
                    reports += self._mine(run, [row[0] for row in notes.collect()])
                    chosen = self._choose(reports)
            if chosen is None:
                raise CommitConflict(self._incomplete(reports))
            self.event_time.record(self.catalog, self.root, self.query_id, batch_id, chosen)
            infos = [r.info for r in chosen]
            commit_started = time.perf_counter()
            self.catalog.commit_batch(self.root, self.query_id, batch_id, infos)
            commit_ms = (time.perf_counter() - commit_started) * 1000
        except BaseException as exc:
            for df_cached in cached:
                df_cached.unpersist()
            if isinstance(exc, Exception) and not isinstance(exc, CatalogError) and committed:
                lost = lost_state(self.catalog, self.storage, self.query_id, batch_id, committed)
                if lost is not None:
                    raise lost from None
            raise
        duplicates = len(reports) - len(chosen)
        metrics = self._metrics(chosen, duplicates, commit_ms, (time.perf_counter() - started))
        metrics.extra.update(event_time_metrics(chosen, watermarks))
        self.catalog.record_batch_metrics(self.root, self.query_id, batch_id, metrics)
        if self.progress:
            publish(df, batch_id, metrics)
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
        return BatchResult(batch_id, output, infos, metrics, chosen, cached)

    @staticmethod
    def _mine(run: str, notes: Sequence[str]) -> list[TaskReport]:
        """This ``run_batch`` call's reports among the report column's values."""
        reports = [TaskReport.from_json(n) for n in notes]
        return [r for r in reports if r.run == run]

    def _choose(self, reports: list[TaskReport]) -> list[TaskReport] | None:
        """One report per store (the first; the others are duplicate attempts or
        recomputations, whose files stay uncommitted), or None while a partition of an
        operator has none."""
        first: dict[StoreId, TaskReport] = {}
        for report in reports:
            first.setdefault(report.info.store, report)
        expected = {
            StoreId(op.operator_id, p, op.store_name)
            for op in self.operators
            for p in range(op.num_partitions)
        }
        if set(first) != expected:
            return None
        return [first[s] for s in sorted(expected, key=lambda s: (s.operator_id, s.partition_id))]

    def _incomplete(self, reports: list[TaskReport]) -> str:
        got = {r.info.store for r in reports}
        lines = []
        for op in self.operators:
            partitions = sorted(
                s.partition_id
                for s in got
                if (s.operator_id, s.store_name) == (op.operator_id, op.store_name)
            )
            if partitions != list(range(op.num_partitions)):
                lines.append(
                    f"operator {op.operator_id} returned checkpoints for partitions "
                    f"{partitions}, expected exactly 0..{op.num_partitions - 1}"
                )
        return f"query {self.query_id}: " + "; ".join(lines)

    @staticmethod
    def _metrics(
        reports: list[TaskReport], duplicates: int, commit_ms: float, batch_s: float
    ) -> BatchMetrics:
        hits = sum(1 for r in reports if r.cache_hit)
        return BatchMetrics(
            rows_in=sum(r.rows_in for r in reports),
            keys_updated=sum(r.keys_updated for r in reports),
            state_rows=sum(r.info.rows for r in reports),
            bytes_written=sum(r.info.bytes_written for r in reports),
            commit_ms=commit_ms,
            cache_hits=hits,
            cache_misses=len(reports) - hits,
            extra={
                "batch_ms": batch_s * 1000,
                "cache_hit_rate": hits / len(reports),
                "load_sources": {
                    s: sum(1 for r in reports if r.load_source == s)
                    for s in sorted({r.load_source for r in reports})
                },
                "max_task_ms": max(r.task_ms for r in reports),
                "max_load_ms": max(r.load_ms for r in reports),
                "deltas_applied": sum(r.deltas_applied for r in reports),
                "duplicate_attempts": duplicates,
                "repairs": [x for r in reports for x in r.repairs],
            },
        )

    # --- Structured Streaming -----------------------------------------------------------

    def foreach_batch(
        self, sink: Sink | None = None, *, cache_output: bool = False
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function: run the batch, hand its output to
        ``sink(output_df, batch_id)`` (one Spark job; ``cache_output=True`` if the sink runs
        several actions), commit."""

        def process(df: DataFrame, batch_id: int) -> None:
            self.run_batch(df, batch_id, sink=sink, cache_output=cache_output).release()

        return process
