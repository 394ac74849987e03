"""A SparkSession set up for the runtime: executors use this interpreter, quiet logs."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def spark_session(
    master: str = "local[2]",
    *,
    app_name: str = "state-runtime",
    shuffle_partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (so they see this package).

    ``master`` may be ``local[N]``, ``local-cluster[2,1,1024]`` (two executor JVMs) or a
    cluster URL; on a real cluster ship the package with ``--py-files`` or a wheel instead.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Python workers talk to the JVM over Unix domain sockets (Spark 4.1+): each
        # mapInArrow task costs less (see docs/runtime.md, "Where a batch's time goes").
        .config("spark.python.unix.domain.socket.enabled", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.pyspark.python", sys.executable)
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
