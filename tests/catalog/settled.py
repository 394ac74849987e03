"""Waiting until a reader's cursor may pass what a test wrote (``sql/positions.py``).

On PostgreSQL a row is read after a position only once every older writing transaction of
the server ended: another suite's or a benchmark's, on a shared server, for a moment. A test
that reads right after it wrote waits for that; on SQLite the first read has it all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from typing import TypeVar

SETTLE = 30.0
"""Seconds a test waits at most: the other writers' transactions hold reading back, never
lose a row."""
T = TypeVar("T", bound=Sized)


def settled(read: Callable[[], T], count: int) -> T:
    """``read()`` once it returns ``count`` rows (or its last answer after ``SETTLE``)."""
    deadline = time.monotonic() + SETTLE
    while True:
        found = read()
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
