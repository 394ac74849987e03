"""Durations as people write them in settings: ``90s``, ``15m``, ``1h``, ``2d``, ``1w``."""

from __future__ import annotations

import re
from datetime import timedelta

from state_runtime.errors import InvalidArgument

_DURATION_RE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION = timedelta(days=365 * 100)


def parse_duration(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"``, ``"1w"`` (a bare number is seconds); ``0`` is
    zero. InvalidArgument for anything else, or for more than a hundred years."""
    match = _DURATION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(
            f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 90s, 15m, 1h)"
        )
    seconds = float(match["n"]) * _UNITS[match["unit"] or "s"]
    if seconds > MAX_DURATION.total_seconds():
        raise InvalidArgument(f"invalid duration {text!r}: longer than 100 years")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The inverse of :func:`parse_duration`, in the largest exact unit."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"
