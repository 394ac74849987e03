"""``state_runtime.failures``: our error found again in the text Spark wraps it in (the task's
traceback inside a driver-side error, the JVM's stack after it), rebuilt as its own class with
the store, version and file it names; the paragraph shown; the trace in the log file. (The
real wrappers, through a Spark job and a stream, are in tests/runtime/test_failure_output.py
and tests/runtime/test_telemetry.py.)"""

from __future__ import annotations

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
