"""The driver side of a stateful query: one micro-batch at a time, committed atomically.

For batch ``b`` the driver checks the batch against the catalog (schemas, order), reads batch
``b - 1``'s committed checkpoint ids and ships them to the tasks; each task opens its
partitions' stores at exactly those checkpoints, applies the batch, commits new deltas and
reports them as rows of the stage's output. The driver commits all partitions of all operators
in one catalog transaction, from the task reports: the files, the holders, the commit and the
batch's metrics (tasks open no catalog connection). A batch costs the catalog two
transactions whatever its partitions: ``begin_batch`` (reads ``b - 1``'s ids and records the
batch's intent before any task runs) and ``commit_batch``. The intent lets maintenance find
files of attempts the driver never heard of (``catalog/sql/batch_intents.py``). A replayed batch
recomputes from ``b - 1``'s ids, so every store's lineage stays linear.

On the normal path a batch is one Spark job: the sink's action runs the stateful stage, whose
output (report rows filtered out) feeds the sink directly, and an observation of the stage
collects the reports on the way (no cache, no second action). When the observation is
missing or incomplete (the sink ran no action, took a few rows, or ran an action whose
metrics do not come back), one more job reads the reports from the stage's data. A sink that
runs several actions says so with ``cache_output=True``; otherwise each action recomputes the
stage and writes duplicate deltas, which the commit ignores (it picks one checkpoint per
partition; the duplicates it saw are recorded as orphans, the ones it did not see are found by
the reconciliation sweep). The same code runs on a classic and a
Spark Connect session (``spark_kind.py`` holds the few differences).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from state_runtime.catalog import (
    BatchMetrics,
    BatchStart,
    Catalog,
    StoreKey,
    Suspects,
)
from state_runtime.catalog import catalog_url as default_catalog_url
from state_runtime.errors import (
    BatchOutOfOrder,
    CatalogError,
    CommitConflict,
    InvalidArgument,
)
from state_runtime.failures import log_failure, typed_error
from state_runtime.identity import CheckpointRef, StoreId, validate_name
from state_runtime.maintenance.restore import SPARK_CHECKPOINT
from state_runtime.runtime.batch_reports import (
    batch_metrics,
    choose,
    duplicates_of,
    incomplete,
    mine,
    store_figures,
)
from state_runtime.runtime.coordinator import holders
from state_runtime.runtime.event_time import EventTimeClock, event_time_metrics
from state_runtime.runtime.loss import lost_state, refuse_expired_base
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.query_check import check_query
from state_runtime.runtime.registration import plan_registration, stores_of
from state_runtime.runtime.spark_kind import (
    default_parallelism,
    observation,
    observed,
    session_mark,
    speculating,
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
    with_skipped,
)
from state_runtime.runtime.telemetry import OtelExport
from state_runtime.runtime.times import SESSION_TIME_ZONE_CONF
from state_runtime.runtime.watermark import BatchWatermarks, Watermark
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage, open_storage
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.schema_history import SchemaHistory

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
    ``spark_progress.py``). ``spark_checkpoint``: the stream's ``checkpointLocation`` (""
    when batches run without one), recorded with each batch and named in the command a loss
    advises (see ``loss.py``); :func:`write_stream` sets it with the stream's.
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
        telemetry: OtelExport | None = None,
        progress: bool = False,
        spark_checkpoint: str | None = None,
    ) -> None:
        self.query_id = validate_name(query_id, "query id")
        if not operators:
            raise InvalidArgument("a stateful query needs at least one operator")
        ids = [(op.operator_id, store.name) for op in operators for store in op.stores]
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
        self.telemetry = telemetry
        self.progress = progress
        self.spark_checkpoint = spark_checkpoint
        self._registered = False
        self._histories: dict[tuple[int, str], SchemaHistory] = {}
        self._beats: dict[int, tuple[str, DataFrame]] = {}
        self._speculation: bool | None = None

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

    def _register(self, batch_id: int, schema: StructType) -> None:
        """Register every store, record each operator's layout (partition count and routing)
        and schema history (``registration.py``: refusals before any task runs) in one read
        and one write of the catalog. Deleted stores: ``opened``."""
        registered = self.catalog.registered(self.root)
        self.operators = [op.opened(registered.histories) for op in self.operators]
        operators, histories = plan_registration(
            self.query_id, self.root, self.spark_checkpoint, self.operators, batch_id, schema,
            registered,
        )  # fmt: skip
        self.catalog.register_query(self.root, self.query_id, batch_id, operators)
        self._histories.update(histories)
        self._registered = True

    def _committed_before(self, batch_id: int, start: BatchStart) -> dict[StoreId, CheckpointRef]:
        """Batch ``batch_id - 1``'s committed ids (read by ``begin_batch``); refuse a batch out
        of order (older than the last committed one, after a gap, or one a repartition
        switched at or before: it ran on the old layout) before any task runs.

        The query's position is its last committed batch or, if later, the batch a restore
        returned it to: a restore that restarted every store leaves no commit of that batch,
        and the next batch (or its replay after a later restore) starts from empty stores."""
        last = max((b for b in (start.last_batch, start.restored) if b is not None), default=None)
        if last is not None and batch_id < last:
            raise BatchOutOfOrder(
                f"batch {batch_id} of query {self.query_id} is older than its last committed "
                f"batch {last}: only the last batch may run again (a replay)",
                store=start.last_store,
            )
        if last is not None and batch_id > last + 1:
            raise BatchOutOfOrder(
                f"batch {batch_id - 1} of query {self.query_id} is not committed in the "
                f"catalog (a gap): its last committed batch is {last}, so only batch {last} "
                f"(a replay) or {last + 1} may run",
                store=start.last_store,
            )
        for layout in start.layouts.values():
            if layout.run_id is not None and batch_id < layout.from_batch:
                raise BatchOutOfOrder(
                    f"batch {batch_id} of query {self.query_id} ran on the layout before "
                    f"repartition run {layout.run_id}, which moved operator "
                    f"{layout.operator_id} ({layout.store_name}) to {layout.num_partitions} "
                    f"partitions at batch {layout.from_batch - 1}: the repartition replaced "
                    f"that batch's state, so it cannot run again; the query goes on at batch "
                    f"{layout.from_batch} (docs/repartition.md)",
                    store=start.last_store,
                )
        refuse_expired_base(start, self.query_id, batch_id)
        if batch_id - 1 == start.restored or start.restarted_base:
            return start.previous
        if batch_id == 0 or start.previous:
            before = partial(self.catalog.committed_before, self.root, self.query_id, batch_id)
            return with_skipped(start.previous, stores_of(self.operators), before)
        # what the stores committed before this batch (a replay's own commits are no base)
        earlier = self.catalog.committed_before(self.root, self.query_id, batch_id)
        ours = {
            store: ref
            for store, ref in earlier.items()
            if any(store.operator_id == op.operator_id for op in self.operators) and ref.version
        }
        if ours:
            raise BatchOutOfOrder(
                f"batch {batch_id - 1} of query {self.query_id} is not committed in the catalog, "
                f"but its stores committed versions before it (e.g. {next(iter(ours.items()))})"
                f"; last committed batch: {start.last_batch}. The query's "
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
        spec = TaskSpec(
            storage=self.storage,
            query_id=self.query_id,
            batch_id=batch_id,
            run=run,
            operator=op,
            schema_histories={s.name: self._histories[op.operator_id, s.name] for s in op.stores},
            base=base_refs(committed, op),
            batch_time_ms=batch_time_ms,
            worker_settings=WorkerSettings.from_env(),
            event_time=self.event_time.spec(watermarks, self.operators.index(op)),
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
        cached, computed once). Without a sink the output is cached and computed here (its
        report rows collected; no observation read), for the caller to use after the commit.
        If the driver fails between the sink and the commit, the replayed batch recomputes
        and the sink sees the output again: at-least-once, as with any ``foreachBatch`` sink.
        ``batch_time_ms`` (default: now) is the batch's clock for timeouts, the same in every
        task.
        """
        started = time.perf_counter()
        schema = df.schema  # the batch's one analysis of its input
        check_query(self.operators, self.event_time.watermark, schema)
        batch_time = int(time.time() * 1000) if batch_time_ms is None else batch_time_ms
        if not self._registered:
            self._register(batch_id, schema)
        run = uuid.uuid4().hex
        operators = [
            (op.operator_id, s.name, op.num_partitions) for op, s in stores_of(self.operators)
        ]
        start = self.catalog.begin_batch(self.root, self.query_id, batch_id, run, operators)
        committed = self._committed_before(batch_id, start)
        watermarks = self.event_time.watermark_for(self.catalog, self.root, self.query_id, batch_id)
        spark = df.sparkSession
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
                # without a sink no action ran: nothing to read (a classic read waits 1 s)
                sunk = observed(channel).get("reports") if sink is not None else None
                reports = mine(run, sunk or [])
                chosen = choose(self.operators, reports)
                if chosen is None:  # no sink, or its actions did not bring every report back
                    notes = staged.filter(F.col(REPORT_COLUMN).isNotNull()).select(REPORT_COLUMN)
                    reports += mine(run, [row[0] for row in notes.collect()])
                    chosen = choose(self.operators, reports)
            if chosen is None:
                raise CommitConflict(incomplete(self.query_id, self.operators, reports))
            self.event_time.record(self.catalog, self.root, self.query_id, batch_id, chosen)
            infos = [r.info for r in chosen]
            duplicates = duplicates_of(reports, chosen)
            metrics = batch_metrics(chosen, len(duplicates), 0.0, time.perf_counter() - started)
            metrics.extra.update(event_time_metrics(chosen, watermarks))
            if self.spark_checkpoint is not None:
                metrics.extra[SPARK_CHECKPOINT] = self.spark_checkpoint
            commit = self.catalog.commit_batch(
                self.root,
                self.query_id,
                batch_id,
                infos,
                run=run,
                duplicates=[r.info for r in duplicates],
                holders=holders(chosen),
                suspects=self._suspects(spark, chosen, duplicates),
                metrics=metrics,
            )
        except BaseException as exc:
            for df_cached in cached:
                df_cached.unpersist()
            if isinstance(exc, Exception) and not isinstance(exc, CatalogError) and committed:
                lost = lost_state(
                    self.catalog,
                    self.storage,
                    self.query_id,
                    batch_id,
                    committed,
                    exc,
                    self.spark_checkpoint,
                )
                if lost is not None:
                    if self.telemetry is not None and isinstance(lost.store, StoreKey):
                        self.telemetry.lost(self.query_id, lost.store)
                    raise lost from None
            typed = typed_error(exc) if isinstance(exc, Exception) else None
            if typed is not None and typed is not exc:  # raised in a task, wrapped by Spark
                raise typed from exc
            raise
        metrics = replace(metrics, commit_ms=commit.commit_ms)  # as the catalog recorded it
        if self.telemetry is not None:
            self.telemetry.batch(
                self.root, self.query_id, metrics, store_figures(self.root, chosen)
            )
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

    def _suspects(
        self, spark: SparkSession, chosen: list[TaskReport], duplicates: list[TaskReport]
    ) -> Suspects:
        """The stores whose folders may hold files of attempts the driver did not hear of:
        those a retried task committed, those with duplicate reports; every store
        when Spark may run speculative copies (any task may have a loser)."""
        if self._speculation is None:
            self._speculation = speculating(spark)
        if self._speculation:
            return "all"
        retried = {r.info.store for r in chosen if r.attempt > 0}
        return retried | {r.info.store for r in duplicates}

    # --- Structured Streaming -----------------------------------------------------------

    def foreach_batch(
        self, sink: Sink | None = None, *, cache_output: bool = False
    ) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function: run the batch, hand its output to
        ``sink(output_df, batch_id)`` (one Spark job; ``cache_output=True`` if the sink runs
        several actions), commit. A batch that fails with our error raises it alone, its
        full trace appended to the log file (``state_runtime.failures``): the streaming
        query's error then carries the one paragraph, not the tasks' tracebacks."""

        def process(df: DataFrame, batch_id: int) -> None:
            try:
                self.run_batch(df, batch_id, sink=sink, cache_output=cache_output).release()
            except Exception as exc:
                typed = typed_error(exc)
                if typed is None:
                    raise
                log_failure(exc)
                raise typed from None

        return process
