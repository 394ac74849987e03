"""How a failure is shown: one paragraph on the terminal, the whole trace in a log file.

Every surface that ends in a failure (``statestore``, ``make demo``, a stream through
``foreachBatch``, a Dagster or Airflow task) shows the library's error the same way:
:func:`failure_paragraph`, one masked paragraph starting with the error's stable code
(``error: [STATE_...] what happened (store=..., file=...)``), the line the CLI prints.

An error raised in a Spark task reaches the driver wrapped, as text, often several times
over: pyspark's ``PythonException`` around the task's traceback, a Py4J or Spark Connect
error around that, a ``StreamingQueryException`` around the ``foreachBatch`` function's
traceback. :func:`typed_error` is the one place that finds our error again, by its code,
whatever wrapped it. :func:`log_failure` appends the full trace to the log file
(:func:`log_file`: ``$STATE_LOG_FILE``, else ``state-runtime-<uid>.log`` in the temporary
folder), where :func:`~state_runtime.runtime.spark_session.spark_session` also sends the
JVM's output. :func:`ends_in_paragraph` ends a program (the demo, a driver of the user's) that
way. :func:`quiet_warnings` hides, while one of our entry points runs (``statestore``, the
demo, the Airflow tasks, Dagster's repartition job), the Python warnings that are not the
user's business; a program of the user's keeps its warning filters as they are.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from state_runtime import errors
from state_runtime.errors import MaintenanceRefused, StateStoreError
from state_runtime.redaction import redact

LOG_FILE_ENV = "STATE_LOG_FILE"

_TYPED = re.compile(r"\[(STATE_[A-Z_]+)\] ([^\n]*)")
_CONTEXT = re.compile(r" \(((?:store|version|checkpoint_id|file)=[^\n]*)\)\s*$")
_FIELD = re.compile(
    r"(store|version|checkpoint_id|file)=(.*?)(?=, (?:store|version|checkpoint_id|file)=|$)"
)
NOT_THE_USERS_BUSINESS = (
    # pyspark's, each time it checks the pandas version: what the runtime uses of pandas
    # runs (and is tested) on the pandas this project installs
    (FutureWarning, "PySpark does not yet fully support pandas"),
)
"""The Python warnings (category, start of the message) :func:`quiet_warnings` hides."""
_JVM_TRACE = "\nJVM stacktrace:"
"""Where pyspark appends the JVM's stack to an error's text (the causes, repeated)."""


def _by_code() -> dict[str, type[StateStoreError]]:
    classes: dict[str, type[StateStoreError]] = {}
    pending: list[type[StateStoreError]] = [StateStoreError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:
            classes.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return classes


def _rebuilt(code: str, text: str) -> StateStoreError:
    """The error of ``code`` from its message text (``what happened (store=..., ...)``)."""
    cls = _by_code().get(code, StateStoreError)
    context: dict[str, str | int | None] = {}
    found = _CONTEXT.search(text)
    if found:
        fields = dict(_FIELD.findall(found.group(1)))
        version = fields.get("version", "")
        context = {
            "store": fields.get("store"),
            "version": int(version) if version.isdigit() else None,
            "checkpoint_id": fields.get("checkpoint_id"),
            "path": fields.get("file"),
        }
        text = text[: found.start()]
    error = cls.__new__(cls)
    StateStoreError.__init__(error, text.rstrip(), **context)  # type: ignore[arg-type]
    return error


def typed_error(exc: BaseException) -> StateStoreError | None:
    """Our error behind ``exc``: ``exc`` itself, its cause or context, or the last one named
    in its text (a Spark wrapper's message holds the failing task's traceback, whose last
    typed line is the one raised last); None if it holds none (a bug, or Spark's own error)."""
    seen: set[int] = set()
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for link in chain:
        if isinstance(link, StateStoreError):
            return link
    for link in chain:
        text = str(link).split(_JVM_TRACE, 1)[0]
        found = _TYPED.findall(text)
        if found:
            code, message = found[-1]
            return _rebuilt(code, message)
    return None


def error_line(error: StateStoreError) -> str:
    """The error as one masked line, as ``statestore`` prints it after ``error: ``."""
    prefix = "refused: " if isinstance(error, MaintenanceRefused) else ""
    return " ".join(redact(f"{prefix}{error}").split())


def failure_paragraph(exc: BaseException, *, log: Path | None = None) -> str:
    """What to show for ``exc``: our error's line (``error: [CODE] ...``), else the first line
    of an unexpected error; with ``log``, a second line naming the file with the full trace."""
    error = typed_error(exc)
    if error is not None:
        line = error_line(error)
    else:
        first = next((s for s in str(exc).splitlines() if s.strip()), "")
        line = " ".join(redact(f"unexpected {type(exc).__name__}: {first}").split())
    return f"error: {line}" + (f"\nfull trace: {log}" if log is not None else "")


def log_file() -> Path:
    """Where full traces and the JVM's output go: ``$STATE_LOG_FILE``, else
    ``state-runtime-<uid>.log`` in the temporary folder (appended to, by every process)."""
    configured = os.environ.get(LOG_FILE_ENV, "").strip()
    if configured:
        return Path(configured)
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    return Path(tempfile.gettempdir()) / f"state-runtime-{user}.log"


def log_failure(exc: BaseException, path: Path | None = None) -> Path:
    """Append ``exc``'s full trace (masked, with the time) to ``path`` (default
    :func:`log_file`) and return the file's path."""
    path = path or log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(f"--- {datetime.now(UTC).isoformat(timespec='seconds')} pid {os.getpid()}\n")
        out.write(full_trace(exc))
    return path


def full_trace(exc: BaseException) -> str:
    """``exc``'s whole trace, its causes included, masked: what the log file holds and
    ``--verbose`` prints."""
    return redact("".join(traceback.format_exception(exc)))


@contextmanager
def ends_in_paragraph(*, log: Path | None = None, verbose: bool = False) -> Iterator[None]:
    """For a program's main (the demo, a driver of the user's around ``awaitTermination``):
    an exception raised inside ends the process (exit code 1) with its one paragraph on
    stderr, its full trace appended to ``log`` (default :func:`log_file`) and, with
    ``verbose``, printed first."""
    try:
        yield
    except Exception as exc:
        path = log_failure(exc, log)
        if verbose:
            print(full_trace(exc), file=sys.stderr)
        print(failure_paragraph(exc, log=path), file=sys.stderr)
        raise SystemExit(1) from None


def reported(exc: BaseException) -> tuple[StateStoreError, str] | None:
    """For a task that fails with ``exc`` (a Dagster step, an Airflow task): our error behind it
    and the paragraph to fail with, naming the log file where its trace was appended; None if
    ``exc`` holds no error of ours (let it fail as it is)."""
    error = typed_error(exc)
    if error is None:
        return None
    return error, failure_paragraph(error, log=log_failure(exc))


@contextmanager
def quiet_warnings() -> Iterator[None]:
    """Meanwhile, the warnings of :data:`NOT_THE_USERS_BUSINESS` are not shown (the filters
    before are restored after): for our entry points, not set on import of the library."""
    with warnings.catch_warnings():
        for category, message in NOT_THE_USERS_BUSINESS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
