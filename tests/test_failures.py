"""``state_runtime.failures``: our error found again in the text Spark wraps it in (the task's
traceback inside a driver-side error, the JVM's stack after it), rebuilt as its own class with
the store, version and file it names; the paragraph shown; the trace in the log file. (The
real wrappers, through a Spark job and a stream, are in tests/runtime/test_failure_output.py
and tests/runtime/test_telemetry.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from state_runtime.errors import (
    CatalogUnavailable,
    CheckpointFileCorrupt,
    MaintenanceRefused,
    MissingExtra,
)
from state_runtime.failures import failure_paragraph, log_failure, typed_error

CORRUPT = CheckpointFileCorrupt(
    "corrupt checkpoint file: truncated",
    store="0/1/default",
    version=3,
    checkpoint_id="abc",
    path="state/0/1/default/3_abc.delta",
)


def _wrapped(inner: str) -> RuntimeError:
    """Spark's shape: a task's Python traceback inside the driver's error, then the JVM's
    stack naming a cause again."""
    return RuntimeError(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        'Traceback (most recent call last):\n  File "worker.py", line 1, in main\n'
        f"state_runtime.errors.{inner}\n\nJVM stacktrace:\n"
        "org.apache.spark.SparkException: [STATE_ERROR] another cause (store=9/9/x)\n"
    )


def test_an_error_inside_spark_text_is_rebuilt_as_itself() -> None:
    found = typed_error(_wrapped(f"CheckpointFileCorrupt: {CORRUPT}"))
    assert isinstance(found, CheckpointFileCorrupt)
    assert str(found) == str(CORRUPT)
    assert (found.store, found.version, found.checkpoint_id, found.path) == (
        "0/1/default",
        3,
        "abc",
        "state/0/1/default/3_abc.delta",
    )
    assert failure_paragraph(_wrapped(f"CheckpointFileCorrupt: {CORRUPT}")) == f"error: {CORRUPT}"
    # a class with its own constructor is rebuilt too; the last typed line wins
    extra = MissingExtra("Spark Connect", "connect", "grpcio")
    twice = _wrapped(f"CheckpointFileCorrupt: {CORRUPT}\nDuring handling:\nMissingExtra: {extra}")
    assert type(typed_error(twice)) is MissingExtra and str(typed_error(twice)) == str(extra)


def test_the_chain_and_the_paragraph() -> None:
    try:
        try:
            raise CORRUPT
        except CheckpointFileCorrupt as inner:
            raise RuntimeError("a wrapper saying nothing") from inner
    except RuntimeError as outer:
        assert typed_error(outer) is CORRUPT
    refused = MaintenanceRefused("retention window 1m is below the minimum")
    assert failure_paragraph(refused) == f"error: refused: {refused}"
    down = CatalogUnavailable("cannot connect to the catalog at\npostgresql://u:secret@h/db")
    assert failure_paragraph(down, log=Path("/x.log")) == (
        "error: [STATE_CATALOG_UNAVAILABLE] cannot connect to the catalog at "
        "postgresql://u:***@h/db\nfull trace: /x.log"
    )
    assert typed_error(ValueError("no code here")) is None
    assert failure_paragraph(ValueError("first\nsecond")) == "error: unexpected ValueError: first"


def test_the_trace_goes_to_the_log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_LOG_FILE", str(tmp_path / "logs" / "state.log"))
    try:
        raise CatalogUnavailable("down: postgresql://u:hunter22@h/db")
    except CatalogUnavailable as exc:
        path = log_failure(exc)
    text = path.read_text()
    assert path == tmp_path / "logs" / "state.log"
    assert "Traceback (most recent call last)" in text and "test_the_trace_goes" in text
    assert "hunter22" not in text and "[STATE_CATALOG_UNAVAILABLE]" in text


DRIVER = """
import sys, warnings
from pathlib import Path

# what a driver imports first (numpy sets filters of its own on import)
import numpy, pandas, pyarrow, pyspark.sql  # noqa: E401, F401
from pyspark.errors.exceptions.connect import StreamingQueryException

before = list(warnings.filters)
import state_runtime.cli.statestore  # noqa: F401
import state_runtime.runtime.spark_session  # noqa: F401
from state_runtime.failures import ends_in_paragraph, quiet_warnings

assert warnings.filters == before, "importing the library changed the warning filters"
with quiet_warnings():
    warnings.warn("PySpark does not yet fully support pandas >= 3.0.0.", FutureWarning)
assert warnings.filters == before, "quiet_warnings left a filter behind"

# What awaitTermination raises on Spark Connect when a foreachBatch function failed with
# our error: the function's traceback and the query's logical plan in the message, the
# server's JVM stack beside it
message = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: An exception was "
    "raised by the Python Proxy. Return Message: Traceback (most recent call last):\\n"
    '  File "/x/foreach_batch_worker.py", line 90, in process\\n'
    "    raise typed from None\\n"
    "state_runtime.errors.InvalidArgument: [STATE_INVALID_ARGUMENT] operator 0 (store "
    "default) of query clicks has 4 state partitions in the catalog; it cannot run with 3. "
    "Keep num_partitions=4, or change it with `statestore repartition file:///r --query "
    "clicks --operator 0 --partitions 3` (a dry run; then with --execute) while the query is "
    "stopped (docs/repartition.md)\\n\\n=== Streaming Query ===\\nIdentifier: [id = 1]\\n"
    + "".join(f"+- Project [user#{n}, amount#{n}]\\n" for n in range(60))
)
with ends_in_paragraph(log=Path(sys.argv[1]), verbose=sys.argv[2] == "verbose"):
    raise StreamingQueryException(
        message=message,
        server_stacktrace="org.apache.spark.sql.streaming.StreamingQueryException\\n\\tat x",
    )
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_driver_program_ends_in_the_paragraph(tmp_path: Path, verbose: bool) -> None:
    """A driver program of the user's around ``awaitTermination`` (a subprocess, no JVM: the
    error Spark Connect raises, built as the client builds it): at most 8 lines, the paragraph
    naming the store, the cause and the next command, the log file; the trace and the query
    plan in the log (and first on stderr with ``verbose``); Python's warning filters untouched
    by importing the library, and restored after ``quiet_warnings``."""
    log = tmp_path / "driver.log"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(log), "verbose" if verbose else "quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    trace, _, paragraph = done.stderr.rpartition("error: ")
    lines = ("error: " + paragraph).splitlines()
    assert len(lines) <= 8 and lines[-1] == f"full trace: {log}", done.stderr
    assert lines[0].startswith("error: [STATE_INVALID_ARGUMENT] operator 0 (store default)")
    assert "`statestore repartition file:///r --query clicks --operator 0" in lines[0]
    assert "Streaming Query" not in paragraph and "Traceback" not in paragraph
    assert "FutureWarning" not in done.stderr
    logged = log.read_text()
    assert "Traceback" in logged and "=== Streaming Query ===" in logged
    assert ("Traceback" in trace) is verbose and ("+- Project" in trace) is verbose
