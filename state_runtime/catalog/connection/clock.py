"""The catalog database's clock: the one clock leases, run records and retention go by.

Writers, maintenance hosts and the database each have a clock, and hosts drift. Every time the
catalog records (a lease's expiry, a run's start, a file's recording, the cutoff of the
retention window) is the database's: this host's clock plus the offset to the database's,
measured by one ``SELECT clock_timestamp()`` when first needed and again every
:data:`REMEASURE_S` seconds (no extra round trip per call). A host minutes off therefore
neither steals a live lease (it would see it expired) nor deletes a file inside the window
(it would see it old). SQLite is one file on one host: its clock is that host's.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from state_runtime.catalog.connection.engine import RetryPolicy, run_transaction

REMEASURE_S: Final = 300.0


class DatabaseClock:
    """``now()`` by the database's clock (see the module docstring)."""

    def __init__(self, engine: Engine, retry: RetryPolicy) -> None:
        self.engine = engine
        self.retry = retry
        self._offset: timedelta | None = None
        self._measured = 0.0
        self._lock = threading.Lock()

    def sync(self) -> None:
        """Measure the offset if it is missing or older than REMEASURE_S (PostgreSQL)."""
        if self.engine.dialect.name != "postgresql":
            return
        with self._lock:
            if self._offset is None or time.monotonic() - self._measured > REMEASURE_S:
                self._offset = run_transaction(
                    self.engine, _measure, retry=self.retry, what="read the database clock"
                )
                self._measured = time.monotonic()

    @property
    def offset(self) -> timedelta:
        """The database's clock minus this host's (zero for SQLite)."""
        self.sync()
        return self._offset or timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


def _measure(connection: Connection) -> timedelta:
    before = time.time()
    found: datetime = connection.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    after = time.time()
    local = datetime.fromtimestamp((before + after) / 2, UTC)
    return found.astimezone(UTC) - local
