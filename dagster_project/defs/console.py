"""The console logger of ``state_store_record_job``: Dagster's own, an expected failure shown
as its paragraph.

A broken store fails its partition's ``state_store_record_job`` run on purpose (its partition
shows *Failed*), and the failure is recorded (the run's events, the partition's page). Dagster's
console logger would print it with a stack trace of Dagster's own frames, twice (the step's
failure, then the run's); this one prints the step's failure as its paragraph (the
``Failure``'s description: status since when, why, figures) and the run's as its one line. Any
other error keeps its trace. Dagster 1.13 uses a job's loggers only when its run config names
them (otherwise its default console logger), so the job names this one (``CONSOLE``) in its
default run config.
"""

from __future__ import annotations

import logging
from typing import Any

from dagster import DagsterEventType, Field, InitLoggerContext, logger
from dagster._core.events import DagsterEvent
from dagster._core.log_manager import LOG_RECORD_EVENT_ATTR
from dagster._utils.log import create_console_logger

EXPECTED = "Failure"  # the class of a failure raised on purpose (dagster.Failure)
CONSOLE: dict[str, Any] = {"console": {}}  # a run config's ``loggers``: this console logger


def expected_paragraph(event: DagsterEvent) -> str | None:
    """The paragraph an expected failure is shown as (``""``: the run's, already shown by its
    step), or None for any other event."""
    data = event.event_specific_data
    error = getattr(data, "error", None)
    if error is None or error.cls_name != EXPECTED:
        return None
    if event.event_type is DagsterEventType.RUN_FAILURE:
        return ""
    failure = getattr(data, "user_failure_data", None)
    if failure is not None and failure.description:
        return str(failure.description)
    return str(error.message).split(": ", 1)[-1].strip()  # the message, without its class


class ExpectedFailures(logging.Filter):
    """Replaces the stack trace of an expected failure's record by its paragraph."""

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, LOG_RECORD_EVENT_ATTR, None)
        paragraph = None if event is None else expected_paragraph(event)
        if paragraph is not None:
            head = str(record.msg).split("\n\n", 1)[0]
            record.msg = f"{head}\n\n{paragraph}" if paragraph else head
        return True


@logger(
    {
        "log_level": Field(str, is_required=False, default_value="DEBUG"),
        "name": Field(str, is_required=False, default_value="dagster"),
    },
    description="Dagster's console logger; an expected failure shown as its paragraph.",
)
def console_logger(init_context: InitLoggerContext) -> logging.Logger:
    found = create_console_logger(
        init_context.logger_config["name"], init_context.logger_config["log_level"]
    )
    found.addFilter(ExpectedFailures())
    return found
