"""How ``statestore`` ends: one line on stderr for every error, and a documented exit code.

- 0: done; nothing wrong found.
- 1: done, but problems were found or some work failed (a check, a snapshot, a deletion).
- 2: bad input: an option, argument, setting (``STATE_*`` variable), root or URL is
  malformed, out of range or names nothing. Nothing was done.
- 3: refused by a safety rule (retention below the floor, a window below the minimum).
- 4: the catalog or the storage cannot be used: unreachable, silent past its timeouts, its
  database or schema missing, its schema newer than this code, credentials refused.
- 5: an unexpected internal error (a bug: please report it with the command line).

Every library error names its stable code (``[STATE_...] message``); with ``--json`` the error
is also printed on stdout as ``{"error": {"code": ..., "message": ..., ...}}``. No error
shows a traceback, and every message is masked of secrets
(:mod:`state_runtime.redaction`). The library's warnings go to stderr as ``warning: ...``
lines (with ``-q``, only errors).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, NoReturn

import click

from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.redaction import RedactingFilter, redact

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_REFUSED, EXIT_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5


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


def fail_with(error: StateStoreError, *, as_json: bool = False) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"error": error.details()}, indent=2))
    prefix = "refused: " if isinstance(error, MaintenanceRefused) else ""
    fail(exit_code(error), f"{prefix}{error}")


class StatestoreGroup(click.Group):
    """A click group whose every failure, its own usage errors included, ends as one line
    and a documented exit code."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False
        argv = kwargs.get("args", args[0] if args else None)
        as_json = "--json" in (sys.argv[1:] if argv is None else list(argv))
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            fail(EXIT_USAGE, exc.format_message() + where)
        except click.ClickException as exc:
            fail(exc.exit_code, exc.format_message())
        except click.Abort:
            fail(EXIT_PROBLEMS, "aborted")
        except StateStoreError as exc:
            fail_with(exc, as_json=as_json)
        except Exception as exc:  # a bug: say so in one line, never a traceback
            fail(
                EXIT_INTERNAL,
                f"unexpected {type(exc).__name__}: {exc} (a bug in statestore: please report "
                "it with the command line)",
            )
        sys.exit(result if isinstance(result, int) else EXIT_OK)
