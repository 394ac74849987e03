"""The console logger of the runs that fail on purpose: Dagster's own, an expected failure
shown as its paragraph.

A broken store fails its partition's ``state_store_record_job`` run on purpose (its partition
shows *Failed*), and a validation whose blocking ``lineage_valid`` check fails fails its
``state_validation_job`` run; both failures are recorded (the run's events, the partition's
page, the check's evaluation). Dagster's console logger would print each with a stack trace of
Dagster's own frames; this one prints the step's failure as its paragraph (the ``Failure``'s
description: status since when, why, figures; or each failed blocking check and its
description: how many problems, the first) and the run's as its one line. Any other error
keeps its trace.

Dagster 1.13 uses a job's loggers only when its run config names them (otherwise its default
console logger), so each of these jobs names this one in its default run config. A
partitioned job takes the run config itself (``CONSOLE``: each partition's run config). An
unpartitioned job takes ``WITH_CONSOLE``, a config mapping that adds the logger to the run
config given: a dict there would become Dagster's default for the whole run config, its
resources' config included, which then overrides the resources a run is given
(``execute_in_process(resources=...)`` would run on the code location's resources). The
cleanup job takes ``console_with_op_config``: the same, its op's config shown by its fields.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    Config,
    ConfigMapping,
    DagsterEventType,
    Field,
    InitLoggerContext,
    logger,
)
from dagster._core.events import DagsterEvent
from dagster._core.log_manager import LOG_RECORD_EVENT_ATTR
from dagster._utils.log import create_console_logger

FAILURE = "Failure"  # the class of a failure raised on purpose (dagster.Failure)
CHECK_FAILED = "DagsterAssetCheckFailedError"  # Dagster's, after a blocking check failed
EXPECTED = (FAILURE, CHECK_FAILED)
CONSOLE: dict[str, Any] = {"loggers": {"console": {}}}  # a run config naming this logger
RUN_CONFIG_REST = ("resources", "loggers", "execution")  # a run config's parts beside ops


def with_console(run_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run config given, naming this console logger unless it names loggers itself (a
    ``RunConfig``'s dict names none as ``{}``)."""
    return {**run_config, **({} if run_config.get("loggers") else CONSOLE)}


WITH_CONSOLE = ConfigMapping(  # any run config (``dict``), checked by the job's own schema after
    config_fn=with_console, config_schema=dict, receive_processed_config_values=False
)


def console_with_op_config(op: str, config: type[Config]) -> ConfigMapping:
    """Like ``WITH_CONSOLE`` for a job with one configurable op: the run config keeps its
    shape (``ops.<op>.config``, the rest as given), but ``op``'s config is shown by its own
    fields, with their defaults and descriptions, so the launchpad offers them (a ``dict``
    schema would offer an empty dict: a ``dry_run`` an operator does not see)."""
    fields = Field({"config": Field(config.to_fields_dict(), is_required=False)}, is_required=False)
    return ConfigMapping(
        config_fn=with_console,
        config_schema={
            "ops": Field({op: fields}, is_required=False),
            **{part: Field(dict, is_required=False) for part in RUN_CONFIG_REST},
        },
    )


def expected_paragraph(event: DagsterEvent, failed_checks: list[str]) -> str | None:
    """The paragraph an expected failure is shown as (``""``: the run's, already shown by its
    step), or None for any other event. ``failed_checks``: the failed blocking checks of the
    step, each as its line (the check's evaluation precedes the step's failure)."""
    data = event.event_specific_data
    error = getattr(data, "error", None)
    if error is None or error.cls_name not in EXPECTED:
        return None
    if event.event_type is DagsterEventType.RUN_FAILURE:
        return ""
    failure = getattr(data, "user_failure_data", None)
    if failure is not None and failure.description:
        return str(failure.description)
    if error.cls_name == CHECK_FAILED and failed_checks:
        return " ".join(failed_checks)
    return str(error.message).split(": ", 1)[-1].strip()  # the message, without its class


def failed_check(event: DagsterEvent) -> str | None:
    """A blocking check's evaluation failed with ERROR (what fails its step) as its line
    (``lineage_valid failed: ...``), or None for any other event."""
    evaluation = event.event_specific_data
    if not isinstance(evaluation, AssetCheckEvaluation):
        return None
    if evaluation.passed or not evaluation.blocking:
        return None
    if evaluation.severity is not AssetCheckSeverity.ERROR:
        return None
    return f"{evaluation.check_name} failed: {evaluation.description or ''}".strip()


class ExpectedFailures(logging.Filter):
    """Replaces the stack trace of an expected failure's record by its paragraph. One per
    run's logger: it notes the run's failed blocking checks for the step failure they cause."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_checks: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, LOG_RECORD_EVENT_ATTR, None)
        if event is None:
            return True
        check = failed_check(event)
        if check is not None:
            self.failed_checks.append(check)
        paragraph = expected_paragraph(event, self.failed_checks)
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
