"""A client-side deadline for catalog connections: an attempt that runs too long is cut.

A PostgreSQL server that stops answering, or a network that silently drops packets, leaves
psycopg2 blocked in a read that nothing else ends: the server-side timeouts never reach the
client, and a middlebox that still acknowledges bytes defeats TCP keepalives. One daemon
thread therefore watches every attempt's deadline and, when one passes, shuts the attempt's
socket down. The blocked read then fails at once, as on a dropped connection, and the
transaction helper retries on a new connection.

An attempt's alarm is armed before it takes a connection; the socket is attached as soon as
it exists (a new connection's, from the engine's connect events, before SQLAlchemy's first
queries on it; a pooled one's, at checkout). The alarm is disarmed before the connection
goes back to the pool, under the lock the watchdog fires under, and the watchdog checks that
the descriptor still is the same socket: it never cuts a socket another attempt is using.
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
    """One attempt's deadline; ``fired`` once its socket was cut."""

    deadline: float
    seconds: float
    fd: int | None = None
    inode: int | None = None
    armed: bool = True
    expired: bool = False  # the deadline passed before a socket was attached
    fired: bool = False


@dataclass
class Watchdog:
    """Cuts the sockets of attempts past their deadline (one thread, started on first use)."""

    _heap: list[tuple[float, int, Alarm]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None
    _current: threading.local = field(default_factory=threading.local)

    @contextlib.contextmanager
    def attempt(self, seconds: float) -> Iterator[Alarm | None]:
        """A deadline ``seconds`` from now for this thread's attempt (None: no deadline).
        Attach its socket with :meth:`watch`; it is disarmed when the block ends."""
        if seconds <= 0:
            yield None
            return
        alarm = Alarm(time.monotonic() + seconds, seconds)
        with self._cond:
            heapq.heappush(self._heap, (alarm.deadline, next(self._counter), alarm))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="catalog-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is alarm:  # else the watchdog already wakes up sooner
                self._cond.notify()
        self._current.alarm = alarm
        try:
            yield alarm
        finally:
            self._current.alarm = None
            self.disarm(alarm)

    def watch(self, fd: int) -> None:
        """Attach socket ``fd`` to this thread's running attempt, if it has one."""
        alarm: Alarm | None = getattr(self._current, "alarm", None)
        if alarm is None:
            return
        inode = os.fstat(fd).st_ino
        with self._cond:
            if alarm.armed:
                alarm.fd, alarm.inode = fd, inode
                if alarm.expired:  # out of time already: cut now
                    _cut(alarm)

    def disarm(self, alarm: Alarm | None) -> None:
        """The attempt is over: never cut its socket (call before the connection is reused)."""
        if alarm is not None:
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
    """Shut the attempt's socket down in both directions: a blocked read or write returns at
    once. Nothing happens if it has no socket yet or the descriptor is no longer that socket."""
    if alarm.fd is None:
        alarm.expired = True  # still connecting (bounded by libpq): cut once attached
        return
    try:
        if os.fstat(alarm.fd).st_ino != alarm.inode:
            return
        with socket.socket(fileno=os.dup(alarm.fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        alarm.fired = True
    except OSError:
        pass  # already closed by its owner


WATCHDOG = Watchdog()
