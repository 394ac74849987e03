"""Which schedules and sensors start running on their own: none that writes or deletes.

``make dagster`` (and any fresh deployment) changes nothing on start: every schedule and
sensor that writes snapshots, records validations or deletes files is STOPPED until an
operator turns it on, in the UI (Automation) or with ``dagster schedule start`` /
``dagster sensor start``, or for a deployment with ``STATE_DAGSTER_AUTOSTART``: a
comma-separated list of schedule and sensor names, or ``all``. The store discovery sensor only
adds Dagster partitions for the stores it finds (it observes): it always runs.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from dagster import DefaultScheduleStatus, DefaultSensorStatus

from state_runtime.errors import InvalidArgument

AUTOSTART_ENV = "STATE_DAGSTER_AUTOSTART"


def autostarted() -> set[str]:
    """The names ``STATE_DAGSTER_AUTOSTART`` lists (``{"all"}`` for all); empty by default."""
    raw = os.environ.get(AUTOSTART_ENV, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _starts(name: str) -> bool:
    chosen = autostarted()
    return "all" in chosen or name in chosen


def schedule_status(name: str) -> DefaultScheduleStatus:
    return DefaultScheduleStatus.RUNNING if _starts(name) else DefaultScheduleStatus.STOPPED


def sensor_status(name: str) -> DefaultSensorStatus:
    return DefaultSensorStatus.RUNNING if _starts(name) else DefaultSensorStatus.STOPPED


def check_autostart(known: Collection[str]) -> None:
    """Refuse names in ``STATE_DAGSTER_AUTOSTART`` that are no schedule or sensor here."""
    unknown = autostarted() - set(known) - {"all"}
    if unknown:
        raise InvalidArgument(
            f"{AUTOSTART_ENV} names {sorted(unknown)}, which are no schedule or sensor of this "
            f"code location; known: {sorted(known)} (or 'all')"
        )
