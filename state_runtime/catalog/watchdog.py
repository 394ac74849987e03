"""A client-side deadline for catalog connections: an attempt that runs too long is cut.

A PostgreSQL server that stops answering, or a network that silently drops packets, leaves
psycopg2 blocked in a read that nothing else ends: the server-side timeouts never reach the
client, and a middlebox that still acknowledges bytes defeats TCP keepalives. One daemon
thread therefore watches every attempt's deadline and, when one passes, shuts the
connection's socket down. The blocked read then fails at once, as on a dropped connection,
and the transaction helper retries on a new connection.

An alarm is disarmed before its connection goes back to the pool (under the same lock the
watchdog fires under), so it can never cut a socket that another attempt is using.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(eq=False)
class Alarm:
    """One attempt's deadline on one socket; ``fired`` once the socket was cut."""

    fd: int
    deadline: float
    seconds: float
    armed: bool = True
    fired: bool = False


@dataclass
class Watchdog:
    """Cuts the sockets of attempts past their deadline (one thread, started on first use)."""

    _heap: list[tuple[float, int, Alarm]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None

    @contextlib.contextmanager
    def deadline(self, fd: int | None, seconds: float) -> Iterator[Alarm | None]:
        """Cut socket ``fd`` if the block is still running after ``seconds``; None: no socket
        (SQLite), nothing to watch."""
        if fd is None:
            yield None
            return
        alarm = Alarm(fd, time.monotonic() + seconds, seconds)
        with self._cond:
            heapq.heappush(self._heap, (alarm.deadline, next(self._counter), alarm))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="catalog-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is alarm:  # else the watchdog already wakes up sooner
                self._cond.notify()
        try:
            yield alarm
        finally:
            with self._cond:
                alarm.armed = False

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and not self._heap[0][2].armed:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                _, _, alarm = heapq.heappop(self._heap)
                _cut(alarm)


def _cut(alarm: Alarm) -> None:
    """Shut the socket down in both directions: a blocked read or write returns at once."""
    try:
        with socket.socket(fileno=os.dup(alarm.fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        alarm.fired = True
    except OSError:
        pass  # already closed by its owner


WATCHDOG = Watchdog()
