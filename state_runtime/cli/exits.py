"""How ``statestore`` ends: one line on stderr for every error, and a documented exit code.

- 0: done; nothing wrong found.
- 1: done, but problems were found or some work failed (a check, a snapshot, a deletion).
- 2: bad input: an option, argument, setting (``STATE_*`` variable), root or URL is
  malformed, out of range or names nothing. Nothing was done.
- 3: refused by a safety rule (retention below the floor, a window below the minimum).
- 4: the catalog or the storage cannot be used: unreachable, silent past its timeouts, its
  database or schema missing, its schema newer than this code, credentials refused.
- 5: an unexpected internal error (a bug: please report it with the command line).

``health`` and its alias ``status`` follow the monitoring-plugin convention instead, so that a
monitor can act on the code alone: 0 every store healthy, 1 degraded (a warning), 2 broken
(critical), 3 unknown (a store never validated, or the command could not tell: any error,
bad input included). A closed pipe (``statestore ... | head -1``) ends the command quietly
with 1 (click's own handling of EPIPE; no traceback).

Every library error names its stable code (``[STATE_...] message``); with ``--json`` the error
is also printed on stdout as ``{"error": {"code": ..., "message": ..., ...}}``. No error
shows a traceback: the full trace goes to the log file (``$STATE_LOG_FILE``, else
``state-runtime-<uid>.log`` in the temporary folder: :mod:`state_runtime.failures`), and with
``--verbose`` to stderr as well, before the line. An error of ours raised in a Spark task
(wrapped by Spark) is shown as itself. Every message is masked of secrets
(:mod:`state_runtime.redaction`). The library's warnings go to stderr as ``warning: ...``
lines (with ``-q``, only errors).
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
from typing import Any, NoReturn

import click

from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.failures import (
    error_line,
    full_trace,
    log_failure,
    quiet_warnings,
    typed_error,
)
from state_runtime.redaction import RedactingFilter, redact

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_REFUSED, EXIT_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5
MONITOR_COMMANDS = frozenset({"health", "status"})
"""Commands whose exit codes follow the monitoring-plugin convention (0/1/2/3)."""
MONITOR_HEALTHY, MONITOR_DEGRADED, MONITOR_BROKEN, MONITOR_UNKNOWN = 0, 1, 2, 3


class _Warnings(logging.Handler):
    """The library's warnings (a retried catalog call, a closed abandoned run) on stderr,
    one masked line each, as ``warning: ...``."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RedactingFilter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = " ".join(self.format(record).split())
            click.echo(f"{record.levelname.lower()}: {line}", err=True)
        except Exception:
            self.handleError(record)


def show_warnings(quiet: bool) -> None:
    """Route the library's log records to stderr: warnings and up, errors only if ``quiet``."""
    logger = logging.getLogger("state_runtime")
    handler = next((h for h in logger.handlers if isinstance(h, _Warnings)), None)
    if handler is None:
        handler = _Warnings()
        logger.addHandler(handler)
    handler.setLevel(logging.ERROR if quiet else logging.WARNING)


def exit_code(error: StateStoreError) -> int:
    """The exit code of a library error."""
    if isinstance(error, MaintenanceRefused):
        return EXIT_REFUSED
    if isinstance(error, InvalidArgument):
        return EXIT_USAGE
    return EXIT_FAILED


def fail(code: int, message: str) -> NoReturn:
    """Print ``error: message`` as one masked line on stderr and exit with ``code``."""
    line = " ".join(redact(message).split())
    click.echo(f"error: {line}", err=True)
    sys.exit(code)


def fail_with(
    error: StateStoreError, *, as_json: bool = False, code: int | None = None
) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"error": error.details()}, indent=2))
    fail(exit_code(error) if code is None else code, error_line(error))


class StatestoreGroup(click.Group):
    """A click group whose every failure, its own usage errors included, ends as one line
    and a documented exit code."""

    monitor = False
    """Whether the command invoked is a monitor command (``health``, ``status``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """Like click's, with a "did you mean" for an unknown command (click suggests
        options, not commands)."""
        name = args[0] if args else ""
        if args and self.get_command(ctx, name) is None and not name.startswith("-"):
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        self.monitor = name in MONITOR_COMMANDS
        return super().resolve_command(ctx, args)

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False
        argv = kwargs.get("args", args[0] if args else None)
        words = sys.argv[1:] if argv is None else list(argv)
        as_json, verbose = "--json" in words, "--verbose" in words
        # Set once the command is known, before the group's options are resolved: an error
        # in them (a malformed --root) then ends a monitor command as unknown (3).
        self.monitor = False
        try:
            with quiet_warnings():  # pyspark's, for the commands that start Spark
                result = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            monitor = exc.ctx is not None and exc.ctx.info_name in MONITOR_COMMANDS
            fail(MONITOR_UNKNOWN if monitor else EXIT_USAGE, exc.format_message() + where)
        except click.ClickException as exc:
            fail(exc.exit_code, exc.format_message())
        except click.Abort:
            fail(EXIT_PROBLEMS, "aborted")
        except Exception as exc:
            log = log_failure(exc)
            if verbose:
                click.echo(full_trace(exc), err=True)
            typed = typed_error(exc)  # also one raised in a Spark task, wrapped by Spark
            if typed is not None:
                fail_with(typed, as_json=as_json, code=MONITOR_UNKNOWN if self.monitor else None)
            # a bug: say so in one line, never a traceback
            first = next((s for s in str(exc).splitlines() if s.strip()), "")
            fail(
                MONITOR_UNKNOWN if self.monitor else EXIT_INTERNAL,
                f"unexpected {type(exc).__name__}: {first} (a bug in statestore: please report "
                f"it with the command line and the trace in {log})",
            )
        sys.exit(result if isinstance(result, int) else EXIT_OK)
