"""A stateful query's per-batch figures in Spark's own ``StreamingQueryProgress``.

Spark builds a micro-batch's progress from the streaming plan only: ``stateOperators`` from
its JVM state-store operators, sink metrics from a JVM sink implementing
``ReportsSinkMetrics`` (neither ``foreachBatch``'s sink nor a Python data source's), and
``observedMetrics`` from the streaming plan's ``observe`` nodes, whose values are the last
computation of each of that plan's partitions. The stateful stage runs in the
``foreachBatch`` function, outside that plan, so its figures reach the progress the one way
left: :func:`with_state_progress` adds an observation to the user's stream whose values come
from a column that is empty while the batch runs; once the batch is committed,
:func:`publish` recomputes one partition of the batch's input in a job tagged with the
figures (job tags reach the tasks on classic and Connect sessions alike), the column reads
them there, and the observation's value for that partition becomes the batch's figures. A
``StreamingQueryListener``, ``query.lastProgress`` (also on a Connect client) and the
progress events of the Spark UI's query pages then carry them under
``observedMetrics["state_runtime"]``. See docs/runtime.md, "Spark's monitoring".
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.streaming.listener import StreamingQueryProgress

from state_runtime.catalog import BatchMetrics

log = logging.getLogger("state_runtime.runtime")

OBSERVATION = "state_runtime"
_TAG = "state_runtime-figures-"
_COLUMN = "__state_runtime_figures"
SPARK_NAMES: tuple[tuple[str, str], ...] = (
    ("memoryUsedBytes", "resident_bytes"),
    ("rocksdbSstFileSize", "local_disk_bytes"),
    ("rocksdbReadBlockCacheHitCount", "block_cache_hits"),
    ("rocksdbReadBlockCacheMissCount", "block_cache_misses"),
    ("rocksdbTotalBytesWrittenByCompaction", "compaction_bytes"),
)
"""The figures of state on local disk under the names Spark 4.3 gives the same figures of
its RocksDB provider (``stateOperators[].memoryUsedBytes`` and ``customMetrics``), so that a
dashboard built on those reads ours; each with its :class:`BatchMetrics` field."""
# The figures, in the order Spark shows them; batch_id first (it picks the newest figures).
FIELDS: tuple[tuple[str, str], ...] = (
    ("batch_id", "bigint"),
    ("rows_in", "bigint"),
    ("state_rows", "bigint"),
    ("keys_updated", "bigint"),
    ("bytes_written", "bigint"),
    ("commit_ms", "double"),
    ("cache_hits", "bigint"),
    ("cache_misses", "bigint"),
    ("watermark_ms", "bigint"),
    ("late_rows", "bigint"),
    *((spark, "bigint") for spark, _ in SPARK_NAMES),
)
_STRUCT = "struct<" + ", ".join(f"{name}: {kind}" for name, kind in FIELDS) + ">"
_ARROW_STRUCT = pa.struct(
    [(name, pa.float64() if kind == "double" else pa.int64()) for name, kind in FIELDS]
)


def figures(batch_id: int, metrics: BatchMetrics) -> dict[str, Any]:
    """A committed batch's figures, as the observation shows them."""
    return {
        "batch_id": batch_id,
        "rows_in": metrics.rows_in,
        "state_rows": metrics.state_rows,
        "keys_updated": metrics.keys_updated,
        "bytes_written": metrics.bytes_written,
        "commit_ms": metrics.commit_ms,
        "cache_hits": metrics.cache_hits,
        "cache_misses": metrics.cache_misses,
        "watermark_ms": metrics.extra.get("watermark_ms"),
        "late_rows": metrics.extra.get("late_rows"),
        **{spark: getattr(metrics, field) for spark, field in SPARK_NAMES},
    }


def _tag(values: dict[str, Any]) -> str:
    """A job tag carrying ``values`` (tags may not hold commas: base64 of the JSON)."""
    return _TAG + base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def _tagged(tags: str | None) -> dict[str, Any] | None:
    """The figures in a task's job tags (``spark.job.tags``: Spark prefixes each tag with
    its session or Connect operation), or None."""
    for tag in (tags or "").split(","):
        at = tag.find(_TAG)
        if at >= 0:
            data = tag[at + len(_TAG) :]
            return dict(json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))))
    return None


def _read_figures(ids: pa.Array) -> pa.Array:
    """The figures column for one Arrow batch of rows (executor side): the figures of the
    job's tag, or nulls in a job without one (the batch's own run)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    values = _tagged(context.getLocalProperty("spark.job.tags") if context else None)
    row = values or {name: None for name, _ in FIELDS}
    return pa.array([row] * len(ids), type=_ARROW_STRUCT)


def with_state_progress(stream: DataFrame, name: str = OBSERVATION) -> DataFrame:
    """``stream`` observed as ``name``: each progress of the streaming query that runs a
    :class:`StatefulQuery` made with ``progress=True`` in ``foreachBatch`` shows that batch's
    figures (:data:`FIELDS`) under ``observedMetrics[name]``. The stream's rows and columns
    are unchanged; each input row passes once more through a Python column (Arrow batches)."""
    read = arrow_udf(_read_figures, _STRUCT)  # type: ignore[call-overload]  # stubs: no struct
    column = F.col(_COLUMN)
    metrics = [F.max_by(column[field], column["batch_id"]).alias(field) for field, _ in FIELDS]
    observed = stream.withColumn(_COLUMN, read(F.lit(0))).observe(name, *metrics)
    return observed.drop(_COLUMN)


def publish(df: DataFrame, batch_id: int, metrics: BatchMetrics) -> None:
    """After batch ``batch_id``'s commit: recompute one partition of its input ``df`` (the
    ``foreachBatch`` DataFrame of a stream made by :func:`with_state_progress`) in a job
    tagged with the figures, so that the streaming query's progress shows them. A failure is
    logged, never raised: the batch is committed."""
    spark = df.sparkSession
    tag = _tag(figures(batch_id, metrics))
    spark.addTag(tag)
    try:
        df.limit(1).collect()
    except Exception:
        log.warning("batch %d: its figures did not reach Spark's progress", batch_id, exc_info=True)
    finally:
        spark.removeTag(tag)


def state_figures(
    progress: StreamingQueryProgress | None, name: str = OBSERVATION
) -> dict[str, Any] | None:
    """The state figures a streaming progress carries under ``observedMetrics[name]`` as a
    dict keyed by :data:`FIELDS`, or None when it carries none (no progress yet, as
    ``lastProgress`` before the first batch; a batch whose figures were not published; a
    stream not made by :func:`with_state_progress`).

    Reads every progress the same way: a listener's event and a classic ``lastProgress`` hold
    a Row of the figures, while a Connect client's ``lastProgress``/``recentProgress`` (parsed
    from the server's JSON, pyspark 4.x) hold a Row of two fields, ``values`` and the
    ``schema`` that names them (an observation of exactly those two fields is read as that
    shape)."""
    row: Row | None = None if progress is None else progress.observedMetrics.get(name)
    if row is None:
        return None
    shown = row.asDict()
    if set(shown) == {"values", "schema"} and isinstance(shown["schema"], dict):
        names = [field["name"] for field in shown["schema"]["fields"]]
        return dict(zip(names, shown["values"], strict=True))
    return dict(shown)
