"""Every conversion between Python times and the runtime's integer times, in one place.

As Spark: instants are integers (microseconds since the epoch inside a batch, milliseconds in
the catalog and for timeouts), durations are integers of the same units, never floats (a float
of seconds loses the last millisecond of many instants: ``datetime(2004, 3, 1, 0, 0, 0,
21000).timestamp() * 1000`` is ``...020.99``). A naive datetime is a wall-clock time in the
Spark session's time zone (``spark.sql.session.timeZone``), which the driver reads and ships
with every task; an aware datetime is the instant it names. Microseconds become milliseconds
by flooring, as Spark's ``floorDiv``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pyarrow as pa

from state_runtime.errors import InvalidArgument

MICROS_PER_MS = 1000
SESSION_TIME_ZONE_CONF = "spark.sql.session.timeZone"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_OFFSET = re.compile(r"^(?:UTC|GMT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?$")
_NULL = np.iinfo(np.int64).min


@cache
def time_zone(name: str) -> tzinfo:
    """A Spark session time zone id: a region (``Europe/Paris``), ``UTC``/``Z``, or an offset
    (``+01:00``, ``-0530``, ``UTC+2``, ``GMT-03:00``), as Java's ``ZoneId.of`` accepts them."""
    if name in ("UTC", "Z", "GMT", "UT"):
        return UTC
    offset = _OFFSET.match(name)
    if offset is not None:
        sign, hours, minutes, seconds = offset.groups()
        delta = timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
        return timezone(-delta if sign == "-" else delta)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {name!r} ({SESSION_TIME_ZONE_CONF})") from None


def datetime_micros(value: datetime, zone: str) -> int:
    """``value`` as microseconds since the epoch; a naive ``value`` is read in ``zone``
    (a gap's wall time moves forward by the gap, an overlap's takes the earlier instant, as
    Java's ``ZonedDateTime.of``)."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=time_zone(zone))
    return (aware - _EPOCH) // timedelta(microseconds=1)


def datetime_ms(value: datetime, zone: str) -> int:
    """``value`` as milliseconds since the epoch (floored), naive times read in ``zone``."""
    return datetime_micros(value, zone) // MICROS_PER_MS


def duration_micros(value: timedelta) -> int:
    return value // timedelta(microseconds=1)


def duration_ms(value: timedelta) -> int:
    """A duration in whole milliseconds (floored), exactly."""
    return value // timedelta(milliseconds=1)


def event_micros(column: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A timestamp column as int64 microseconds since the epoch (nulls as INT64 minimum)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_timestamp(column.type):
        raise InvalidArgument(f"event-time column {name!r} must be a timestamp, not {column.type}")
    unit = column.type.unit
    raw = np.asarray(column.cast(pa.int64()).fill_null(_NULL).to_numpy(), dtype=np.int64)
    if unit == "us":
        return raw
    if unit == "ns":
        return np.where(raw == _NULL, raw, raw // 1000)
    scale = {"s": 1_000_000, "ms": 1000}[unit]
    return np.where(raw == _NULL, raw, raw * scale)


def null_times(micros: np.ndarray) -> np.ndarray:
    """Which values of :func:`event_micros` were null."""
    nulls: np.ndarray = micros == _NULL
    return nulls


_DAY_TIME_UNITS = {
    "microsecond": 1,
    "millisecond": 1000,
    "second": 1_000_000,
    "minute": 60_000_000,
    "hour": 3_600_000_000,
}
_DAY_UNITS = {"day": 1, "week": 7}
_NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")


def interval(text: str) -> tuple[int, int] | None:
    """A Spark interval string (``'5 seconds'``, ``'interval 1 hour 30 minutes'``,
    ``'1.5 seconds'``) as ``(days, microseconds)``, or None where Spark's cast to an interval
    gives null (not an interval). Months and years have no fixed length: refused."""
    words = text.lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    if not words or len(words) % 2:
        return None
    days = micros = 0
    for value, name in zip(words[::2], words[1::2], strict=True):
        unit = name.removesuffix("s")
        if _NUMBER.match(value) is None or ("." in value and unit != "second"):
            return None
        if unit in ("month", "year"):
            raise InvalidArgument(f"interval {text!r}: months and years are not supported")
        if unit in _DAY_UNITS:
            days += int(value) * _DAY_UNITS[unit]
        elif unit in _DAY_TIME_UNITS:
            micros += int(Decimal(value) * _DAY_TIME_UNITS[unit])
        else:
            return None
    return days, micros


def plus_days(micros: int, days: int, zone: str) -> int:
    """``micros`` plus ``days`` calendar days in ``zone``, as Spark's ``timestampAddInterval``
    (Java's ``ZonedDateTime.plusDays``: the same wall time, keeping the offset in an overlap
    when it is still valid, moved forward by a gap)."""
    tz = time_zone(zone)
    local = (_EPOCH + timedelta(microseconds=micros)).astimezone(tz)
    wall = local.replace(tzinfo=None) + timedelta(days=days)
    earlier, later = wall.replace(tzinfo=tz, fold=0), wall.replace(tzinfo=tz, fold=1)
    keep = later.utcoffset() == local.utcoffset() != earlier.utcoffset()
    return ((later if keep else earlier) - _EPOCH) // timedelta(microseconds=1)
