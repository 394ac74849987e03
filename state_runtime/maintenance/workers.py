"""How many stores a pass works on at once: as many as the host and the catalog's pool allow.

The passes wait on storage (S3 round trips, disk reads) and on the catalog far more than they
compute, so a host runs :data:`WORKERS_PER_CPU` workers per CPU. Each worker holds one catalog
connection at a time; the run's heartbeat and the pass's own reads (the plan's pages) hold
:data:`RESERVED_CONNECTIONS` more. A count asked beyond what the pool holds is lowered to it,
with a warning naming both: more threads would only queue for connections, and past the
pool's timeout fail.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

from state_runtime.catalog import Catalog
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.redaction import get_logger
from state_runtime.settings import MAINTENANCE

log = get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R")

WORKERS_PER_CPU = 4
RESERVED_CONNECTIONS = 2


def pool_allows(catalog: Catalog) -> int:
    """The workers ``catalog``'s connection pool serves at once (at least 1)."""
    return max(1, catalog.pool_capacity - RESERVED_CONNECTIONS)


def worker_count(catalog: Catalog, policy: MaintenancePolicy, asked: int | None = None) -> int:
    """The workers of a pass: ``asked``, else the policy's ``workers``, else
    :data:`WORKERS_PER_CPU` per CPU; never more than :func:`pool_allows`."""
    wanted = asked if asked is not None else policy.workers
    allowed = pool_allows(catalog)
    if wanted is None:
        return min((os.cpu_count() or 1) * WORKERS_PER_CPU, allowed)
    if wanted > allowed:
        log.warning(
            "%d workers asked (%s or %s), but the catalog's connection pool serves %d at once "
            "(%d connections, %d kept for the run itself): working with %d",
            wanted,
            MAINTENANCE["workers"].option,
            MAINTENANCE["workers"].env,
            allowed,
            catalog.pool_capacity,
            RESERVED_CONNECTIONS,
            allowed,
        )
        return allowed
    return max(1, wanted)


def map_bounded(work: Callable[[T], R], items: Iterable[T], workers: int, name: str) -> Iterator[R]:
    """``work`` of each of ``items`` on ``workers`` threads, the results in ``items``' order;
    ``items`` is read (on the calling thread) only as workers free up, at most two items a
    worker ahead: a pass streams a fleet of any size through a bounded queue (an executor's
    ``map`` would take every item, and hold every result, at once). An item that raises
    stops the map: those queued are cancelled, the running ones finish, the error is raised."""
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        queued: deque[Future[R]] = deque()
        try:
            for item in items:
                if len(queued) >= 2 * workers:
                    yield queued.popleft().result()
                queued.append(pool.submit(work, item))
            while queued:
                yield queued.popleft().result()
        finally:  # the last first: a worker freed meanwhile takes the oldest left, never
            for future in reversed(queued):  # a later one a cancel skipped it to
                future.cancel()


_END = object()
_READ_AHEAD: ThreadPoolExecutor | None = None
"""The process's read-ahead threads (:func:`_read_ahead_pool`)."""
_READ_AHEAD_LOCK = threading.Lock()


def _read_ahead_pool() -> ThreadPoolExecutor:
    """The read-ahead threads every :func:`read_ahead` of the process shares: started once,
    not once a call (a thread's start cost as much CPU as a small catalog's health read it
    served). A call holds one of them for one item at a time and a read never waits on
    another, so calls beyond the threads' number only wait their turn
    (``ThreadPoolExecutor``'s default count)."""
    global _READ_AHEAD
    with _READ_AHEAD_LOCK:
        if _READ_AHEAD is None:
            _READ_AHEAD = ThreadPoolExecutor(thread_name_prefix="read-ahead")
        return _READ_AHEAD


def _forget_read_ahead_pool() -> None:
    """In a forked child: its copy of the pool has no threads (nor may its lock be free), so
    the child starts its own."""
    global _READ_AHEAD, _READ_AHEAD_LOCK
    _READ_AHEAD, _READ_AHEAD_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_read_ahead_pool)


def read_ahead(items: Iterable[T]) -> Iterator[T]:
    """``items``, the next one read on a thread while the caller works on the current one: a
    pass over a catalog's pages waits on the next page's statements while it processes this
    one's (each page its own transaction, on a connection of its own), not after. At most
    one item is read ahead: what is held is the caller's item and the next, three at the most
    (the one after next is read as soon as the next is handed over, while the caller may
    still hold its last), whatever their number; a read ahead still running when the caller
    stops is waited for (``items`` is not read on two threads). Only for a catalog whose pool
    serves more than one thread (``pool_capacity > 1``): an in-memory SQLite database is empty
    on any thread but its own."""
    iterator = iter(items)
    pool = _read_ahead_pool()
    pending = pool.submit(next, iterator, _END)
    try:
        while (item := pending.result()) is not _END:
            pending = pool.submit(next, iterator, _END)
            yield item  # type: ignore[misc]
    finally:
        wait([pending])


@contextmanager
def closing_items(items: Iterator[R]) -> Iterator[Iterator[R]]:
    """``items``, closed when the block ends however it ends: a consumer that raises stops a
    generator such as :func:`map_bounded` at once (its queued work cancelled), not whenever
    the traceback that holds it is freed."""
    try:
        yield items
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
