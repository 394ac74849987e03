"""The catalog database's clock: the one clock leases, run records and retention go by.

Writers, maintenance hosts and the database each have a clock, and hosts drift. Every time the
catalog records (a lease's expiry, a run's start, a file's recording, the cutoff of the
retention window) is the database's. One ``SELECT clock_timestamp()`` reads it when first
needed and again every :data:`REMEASURE_S` seconds; in between, the clock advances by this
host's ``time.monotonic``, which no one sets: a host minutes off therefore neither steals a
live lease (it would see it expired) nor deletes a file inside the window (it would see it
old), and a wall-clock step on a long-running process (an NTP step, a VM resume) moves the
catalog's clock not at all. Before each of the catalog's transactions (:meth:`DatabaseClock.sync`)
the host's wall clock is also compared with the monotonic one; when they part by more than
:data:`STEP_TOLERANCE_S` (a step, or a suspend the monotonic clock slept through) the database
is read again then. ``now()`` itself reads the database only when nothing was read yet: it is
called inside transactions, where a reading would take a second pooled connection while
holding the clock's lock (other threads, each holding a connection, wait on that lock). SQLite
is one file on one host: its clock is that host's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from state_runtime.catalog.connection.engine import RetryPolicy, run_transaction

REMEASURE_S: Final = 300.0
STEP_TOLERANCE_S: Final = 1.0


@dataclass(frozen=True)
class _Reading:
    """The database's time at one instant, with this host's monotonic and wall clocks then."""

    database: datetime
    monotonic: float
    wall: float

    def stale(self, wall: float) -> bool:
        elapsed = time.monotonic() - self.monotonic
        stepped = abs(wall - self.wall - elapsed) > STEP_TOLERANCE_S
        return elapsed > REMEASURE_S or stepped

    def now(self) -> datetime:
        return self.database + timedelta(seconds=time.monotonic() - self.monotonic)


class DatabaseClock:
    """``now()`` by the database's clock (see the module docstring); ``wall``: this host's
    wall clock, in seconds since the epoch (a test steps it)."""

    def __init__(
        self, engine: Engine, retry: RetryPolicy, wall: Callable[[], float] | None = None
    ) -> None:
        self.engine = engine
        self.retry = retry
        self.wall = wall or _host_wall
        self._reading: _Reading | None = None
        self._lock = threading.Lock()

    def _current(self, *, renew: bool) -> _Reading | None:
        """The reading to go by, read if missing (and with ``renew``, if old or outrun by a
        step); None for SQLite."""
        if self.engine.dialect.name != "postgresql":
            return None
        reading = self._reading
        if reading is not None and not (renew and reading.stale(self.wall())):
            return reading
        with self._lock:
            if self._reading is None or (renew and self._reading.stale(self.wall())):
                self._reading = run_transaction(
                    self.engine,
                    lambda c: _measure(c, self.wall),
                    retry=self.retry,
                    what="read the database clock",
                )
            return self._reading

    def sync(self) -> None:
        """Read the database's clock now if due: before a transaction, never inside it."""
        self._current(renew=True)

    def now(self) -> datetime:
        reading = self._current(renew=False)
        return datetime.fromtimestamp(self.wall(), UTC) if reading is None else reading.now()


def _host_wall() -> float:
    return time.time()


def _measure(connection: Connection, wall: Callable[[], float]) -> _Reading:
    before, wall_before = time.monotonic(), wall()
    found: datetime = connection.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    after, wall_after = time.monotonic(), wall()
    return _Reading(found.astimezone(UTC), (before + after) / 2, (wall_before + wall_after) / 2)
