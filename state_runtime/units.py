"""Figures for people: sizes in B/KB/MB, ages in s/m/h/d, times in ms or s.

One home for the CLI's tables and Dagster's metadata, so both print a figure the same way.
"""

from __future__ import annotations

from datetime import timedelta


def size(n: float) -> str:
    """Bytes for people: 1.2 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def age(value: timedelta | None) -> str:
    """A duration in its largest whole unit: 45s, 7m, 3h, 2d; ``-`` for none."""
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


def millis(value: object) -> str:
    """A time in milliseconds for people: 850 ms, 1,204 ms; ``-`` when not a number."""
    return "-" if not isinstance(value, int | float) else f"{value:,.0f} ms"
