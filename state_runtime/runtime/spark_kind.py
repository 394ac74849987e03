"""What differs between a classic and a Spark Connect session, in one place.

Everything else in the runtime, the readers and the maintenance jobs is written once, with
DataFrames, ``mapInArrow`` and observations, and runs on either kind of session. The kind is
known from the session object at run time; nothing is configured.

pyspark chooses its classic or Connect classes (columns, functions, observations) by a
process-wide switch (``SPARK_CONNECT_MODE_ENABLED``), so one Python process uses one kind of
client: a Connect client process may host the Connect server's JVM (``spark_session(remote=
"local")``), but classic DataFrames then no longer work in it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

_PROBE_ROWS = 1 << 16
_parallelism: dict[str, int] = {}


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect client session (``pyspark.sql.connect.session``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (its cores on ``local[N]``).

    Classic sessions ask their SparkContext. A Connect client has none: it reads
    ``spark.default.parallelism`` when set, otherwise it counts the partitions Spark gives a
    ``range`` without a partition count (Spark's default parallelism, by definition), once per
    session."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    key: str = spark.session_id  # type: ignore[attr-defined]
    if key not in _parallelism:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            _parallelism[key] = int(configured)
        else:
            probe = spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
            _parallelism[key] = int(probe.agg(F.max("p")).first()[0]) + 1  # type: ignore[index]
    return _parallelism[key]


def same_session(a: SparkSession, b: SparkSession) -> bool:
    """Whether DataFrames of ``a`` can be used in plans of ``b``. ``foreachBatch`` hands every
    batch a new classic Python session over the same JVM session; a Connect DataFrame is bound
    to its client object."""
    if is_connect(a) or is_connect(b):
        return a is b
    return bool(a._jsparkSession.equals(b._jsparkSession))


def observation() -> Observation:
    """A fresh observation for this process's kind of session."""
    return Observation()


def observed(obs: Observation) -> dict[str, Any]:
    """The observation's metrics if an action has filled them, else ``{}``; never waits.

    A classic observation's ``get`` blocks until an action ran its plan (forever if none
    will), so its promise is checked first. A Connect observation holds the metrics of the
    last action that returned them (each action overwrites the previous values)."""
    if type(obs).__module__.startswith("pyspark.sql.connect"):
        return dict(obs.get)
    promise = obs._jo  # the classic observation's JVM object, set by DataFrame.observe
    if promise is None or not promise.future().isCompleted():
        return {}
    return dict(obs.get)


def speculating(spark: SparkSession) -> bool:
    """Whether Spark may launch speculative copies of tasks (``spark.speculation``)."""
    return (spark.conf.get("spark.speculation", "false") or "false").strip().lower() == "true"
