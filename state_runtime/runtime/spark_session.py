"""A SparkSession set up for the runtime: executors use this interpreter, quiet terminal.

The JVM a session starts writes its output (Spark's log, the Python workers' errors and the
JVM's own start-up notes) to the log file (:func:`state_runtime.failures.log_file`, or
``log_file=``), not to the terminal: a failure reaches the user as the one paragraph of our
error, and the log holds the rest (our entry points also hide pyspark's warning about the
pandas version: :func:`state_runtime.failures.quiet_warnings`).

``spark_session()`` is a classic session; ``spark_session(remote=...)`` (or the environment
variable ``SPARK_REMOTE``, as with pyspark) a Spark Connect client (needs the ``connect``
extra), to a server at ``sc://host:port`` or to one started in this process
(``remote="local"`` on ``master``, or ``remote="local[N]"``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from pyspark.sql import SparkSession

from state_runtime.errors import MissingExtra
from state_runtime.failures import log_file as default_log_file

_CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
"""pyspark's process-wide switch to its Connect classes (see ``spark_kind``)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(app_name: str, shuffle_partitions: int) -> dict[str, str]:
    return {
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # the JVM's log level, set when its SparkContext starts (no sparkContext call needed)
        "spark.log.level": "ERROR",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python workers talk to the JVM over Unix domain sockets (Spark 4.1+): each
        # mapInArrow task costs less (see docs/runtime.md, "Where a batch's time goes").
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.pyspark.python": sys.executable,
    }


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """This process's standard error (file descriptor 2) appended to ``path`` meanwhile: a JVM
    started meanwhile keeps it as its own for good."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _classic(master: str, conf: dict[str, str], log_file: Path) -> SparkSession:
    if _LOCAL_SERVER is None and os.environ.pop(_CONNECT_MODE, None) is not None:
        # inherited from a parent process that hosted a local Connect server (pyspark's
        # process-wide switch): this process never became a Connect client, and with the
        # switch set pyspark's classic builder refuses to start (CONNECT_URL_NOT_SET)
        log.info("ignoring %s inherited from the parent process", _CONNECT_MODE)
    builder = SparkSession.builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with _stderr_to(log_file):
        return builder.getOrCreate()


log = logging.getLogger("state_runtime.runtime")

_LOCAL_SERVER: tuple[str, str] | None = None
"""The ``sc://`` URL of the Connect server this process started, and its master."""
_LOCAL_SERVER_LOCK = threading.Lock()


def _local_connect_server(master: str, conf: dict[str, str], log_file: Path) -> str:
    """Start a Spark Connect server in this process, on a free port with a fresh token (so
    that servers of other processes on the machine are never reached by mistake), and return
    its ``sc://`` URL. Its JVM runs ``master``; from then on this process is a Connect client
    (pyspark's process-wide switch), as with ``SparkSession.builder.remote("local[N]")``.
    A process holds one JVM, so later calls return the server the first one started (a CLI
    command or a Dagster op run in a process that already has one connects to it)."""
    with _LOCAL_SERVER_LOCK:
        if _LOCAL_SERVER is None:
            _start_local_connect_server(master, conf, log_file)
        assert _LOCAL_SERVER is not None
        url, running = _LOCAL_SERVER
    if running != master:
        log.warning(
            "this process's Spark Connect server already runs on %s; %s is not used",
            running,
            master,
        )
    return url


def _start_local_connect_server(master: str, conf: dict[str, str], log_file: Path) -> None:
    global _LOCAL_SERVER
    port = _free_port()
    token = os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", uuid.uuid4().hex)
    remote = os.environ.pop("SPARK_REMOTE", None)  # else pyspark's builder makes a client
    try:
        _classic(
            master,
            {
                **conf,
                "spark.plugins": _CONNECT_PLUGIN,
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port),
                "spark.connect.authenticate.token": token,
            },
            log_file,
        )
    finally:
        if remote is not None:
            os.environ["SPARK_REMOTE"] = remote
    os.environ[_CONNECT_MODE] = "1"
    # "localhost": pyspark sends the token without TLS
    _LOCAL_SERVER = (f"sc://localhost:{port}", master)


def spark_session(
    master: str = "local[2]",
    *,
    app_name: str = "state-runtime",
    shuffle_partitions: int = 4,
    extra: dict[str, str] | None = None,
    remote: str | None = None,
    log_file: Path | None = None,
) -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (so they see this package).

    ``master`` may be ``local[N]``, ``local-cluster[2,1,1024]`` (two executor JVMs) or a
    cluster URL; on a real cluster ship the package with ``--py-files`` or a wheel instead.
    ``remote`` (default: the ``SPARK_REMOTE`` environment variable) makes it a Spark Connect
    session: ``"sc://host:port"`` connects to a running server (its settings are the
    server's; ``extra`` runtime settings still apply), and ``"local"`` (or ``"local[N]"``)
    first starts a server in this process on ``master`` (or ``local[N]``) with the settings
    above. The JVM's output goes to ``log_file`` (default: the library's log file).
    """
    log_file = log_file or default_log_file()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {**_settings(app_name, shuffle_partitions), **(extra or {})}
    remote = remote or os.environ.get("SPARK_REMOTE") or None
    if remote is None and _LOCAL_SERVER is not None:
        remote = "local"  # this process is a Connect client now: classic cannot start here
    if remote is None:
        return _classic(master, conf, log_file)
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:
        client = "grpcio, grpcio-status, googleapis-common-protos or zstandard"
        raise MissingExtra(f"Spark Connect (remote={remote!r})", "connect", client) from None

    if remote.startswith("local"):
        url = _local_connect_server(master if remote == "local" else remote, conf, log_file)
    else:
        url = remote
    builder = ConnectSession.builder.remote(url)
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    return cast(SparkSession, builder.getOrCreate())  # the Connect class stands in for it
