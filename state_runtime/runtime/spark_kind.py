"""What differs between a classic and a Spark Connect session, in one place.

Everything else in the runtime, the readers and the maintenance jobs is written once, with
DataFrames, ``mapInArrow`` and observations, and runs on either kind of session. The kind is
known from the session object at run time; nothing is configured. Nothing here touches the
JVM (no ``sparkContext``, ``_jsparkSession`` or an observation's JVM object): what a classic
session knows is read through the same public API as on Connect.

pyspark chooses its classic or Connect classes (columns, functions, observations) by a
process-wide switch (``SPARK_CONNECT_MODE_ENABLED``), so one Python process uses one kind of
client: a Connect client process may host the Connect server's JVM (``spark_session(remote=
"local")``), but classic DataFrames then no longer work in it.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from typing import Any

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

_PROBE_ROWS = 1 << 16
_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")
_SESSION_MARK = "state_runtime.session"
_OBSERVATION_WAIT_S = 1.0
_parallelism: dict[str, int] = {}


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect client session (``pyspark.sql.connect.session``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The application's default parallelism (its cores on ``local[N]``), known once per
    application (``spark.app.id``): ``spark.default.parallelism`` when set; else the cores of
    a ``local[N]`` / ``local[*]`` / ``local-cluster[N,C,M]`` master (as Spark's schedulers
    count them); else (a cluster) the partitions Spark gives a ``range`` without a partition
    count (Spark's default parallelism, by definition): one small job per application, never
    one per batch."""
    key = spark.conf.get("spark.app.id", None) or ""
    if key not in _parallelism:
        _parallelism[key] = _probe_parallelism(spark)
    return _parallelism[key]


def _probe_parallelism(spark: SparkSession) -> int:
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    master = spark.conf.get("spark.master", None) or ""
    cluster = _LOCAL_CLUSTER.fullmatch(master)
    if cluster is not None:
        return max(int(cluster.group(1)) * int(cluster.group(2)), 2)
    local = _LOCAL_MASTER.fullmatch(master)
    if local is not None:
        cores = local.group(1)
        if cores is None:
            return 1
        return (os.cpu_count() or 1) if cores == "*" else int(cores)
    probe = spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
    return int(probe.agg(F.max("p")).first()[0]) + 1  # type: ignore[index]


def session_mark(spark: SparkSession) -> str:
    """An id of the Spark session behind ``spark`` (set once in its runtime configuration):
    ``foreachBatch`` hands every batch a new Python session object over the same session, and
    a Connect DataFrame can only be used in plans of its own server session."""
    mark = spark.conf.get(_SESSION_MARK, None)
    if not mark:
        mark = uuid.uuid4().hex
        spark.conf.set(_SESSION_MARK, mark)
    return str(mark)


def observation() -> Observation:
    """A fresh observation for this process's kind of session."""
    return Observation()


def observed(obs: Observation) -> dict[str, Any]:
    """The observation's metrics if an action has filled them, else ``{}``; never waits long.

    A Connect observation holds the metrics of the last action that returned them (each
    action overwrites the previous values). A classic observation is filled when an action
    over its plan finishes (synchronously, before the action returns) and its ``get`` blocks
    until then, forever if no such action runs: it is read in a daemon thread, for at most
    ``_OBSERVATION_WAIT_S``. A thread still waiting ends when a later action (the runtime's
    fallback read of the reports, which runs the observed plan) fills the observation."""
    if type(obs).__module__.startswith("pyspark.sql.connect"):
        return dict(obs.get)
    result: dict[str, Any] = {}

    def read() -> None:
        result.update(obs.get)

    reader = threading.Thread(target=read, name="state-runtime-observation", daemon=True)
    reader.start()
    reader.join(_OBSERVATION_WAIT_S)
    return dict(result) if not reader.is_alive() else {}


def speculating(spark: SparkSession) -> bool:
    """Whether Spark may launch speculative copies of tasks (``spark.speculation``)."""
    return (spark.conf.get("spark.speculation", "false") or "false").strip().lower() == "true"
