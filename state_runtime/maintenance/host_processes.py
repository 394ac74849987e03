"""A pass's per-store work dealt to worker processes on this host: every core at work.

The per-store work of the snapshot, validation and cleanup passes is mostly Python (a
snapshot decodes its chain: 10-20 ms of CPU a store), so the threads of one process share one
core under the GIL. :class:`HostProcesses` is the :class:`~state_runtime.maintenance.spread.Spread`
that runs it in ``processes`` worker processes instead: each opens its own catalog by URL
with its first slice (:func:`~state_runtime.maintenance.spread.worker_fleet`, as a Spark task
does) and runs the pass's ordinary work over each slice of the items it is dealt, ``threads``
threads at a time, on that one fleet (its catalog and storage opened once a process, not
once a slice). The processes are started by ``forkserver`` (``spawn`` where there is none), never
forked from the driver, which holds threads and a connection pool.

:func:`spread_for` is where every pass decides how its work runs: the spread it was given
(Spark wins), else :class:`HostProcesses` when :func:`process_count` gives more than one: by
default one per CPU for a pass of at least :data:`PROCESS_MIN_ITEMS` items a process on a
PostgreSQL catalog (on a quiet 2-core host, 2 processes wrote 20,000 stores' snapshots 2.7
times faster than one process's threads, with half their CPU: docs/maintenance.md), or the
count asked (``--processes N``); else None: threads in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import wait as wait_ready
from multiprocessing.util import Finalize
from typing import TypeVar

from state_runtime.errors import WorkerProcessLost
from state_runtime.maintenance.fleet import Fleet, StorageOpener
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.spread import Spread, Work, worker_fleet
from state_runtime.maintenance.workers import RESERVED_CONNECTIONS
from state_runtime.redaction import get_logger
from state_runtime.settings import MAINTENANCE

log = get_logger(__name__)
Item = TypeVar("Item")
Result = TypeVar("Result")

PROCESS_THREADS = 4
"""Threads a worker process runs by default (``--workers`` sets another count): a store's
work waits on the catalog and storage as much as it computes, so a process overlaps a few
(docs/maintenance.md, "Passes on the host's processes", has the measurements)."""
CONNECTION_BUDGET = 64
"""Catalog connections the worker processes of a pass may hold together: processes x
(threads + :data:`~state_runtime.maintenance.workers.RESERVED_CONNECTIONS`). With the
driver's own pool (15), it stays well under PostgreSQL's default ``max_connections`` (100),
leaving room for the streaming jobs; more processes asked are lowered to it, with a warning."""
SLICE_ITEMS = 100
"""Items a process is dealt at a time, at most: small enough that results stream back as
slices finish (the progress advances, memory stays bounded) and that every process gets work."""
IN_FLIGHT = 2
"""Slices queued or running per process: one running, one waiting, none piling up."""
PROCESS_MIN_ITEMS = 250
"""Items each process must get for a pass to start processes unasked: starting one (its
imports, its catalog) costs about a second, some 100 stores' snapshots; a smaller pass keeps
to threads."""


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count): the count
    of processes to ask for on a host of its own."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def process_count(
    asked: int | None, dialect: str, items: int, threads: int = PROCESS_THREADS
) -> int:
    """How many worker processes a pass over ``items`` items uses; 1 is threads in this
    process. Always 1 when 1 was asked, on any catalog but PostgreSQL (a SQLite file has one
    writer: processes would only queue for its lock), for one item, and in a daemonic
    process (an executor's worker, which may not start children). Unasked (None): one per
    CPU (:func:`host_cpus`), at most one per :data:`PROCESS_MIN_ITEMS` items; asked: that
    many, at most one per item. Never more than :data:`CONNECTION_BUDGET` holds at
    ``threads`` threads a process (lowered with a warning when asked)."""
    if asked == 1 or dialect != "postgresql" or items <= 1:
        return 1
    if multiprocessing.current_process().daemon:
        if asked is not None:
            log.warning(
                "%d worker processes asked, but this is a daemonic process (an executor's "
                "worker), which may not start any: working in threads",
                asked,
            )
        return 1
    wanted = min(host_cpus(), items // PROCESS_MIN_ITEMS) if asked is None else min(asked, items)
    allowed = max(1, CONNECTION_BUDGET // (threads + RESERVED_CONNECTIONS))
    if wanted > allowed and asked is not None:
        log.warning(
            "%d worker processes asked (%s or %s), but %d catalog connections "
            "at most are kept for them (%d a process: %d threads, %d for the run): using %d",
            wanted,
            MAINTENANCE["processes"].option,
            MAINTENANCE["processes"].env,
            CONNECTION_BUDGET,
            threads + RESERVED_CONNECTIONS,
            threads,
            RESERVED_CONNECTIONS,
            allowed,
        )
    return max(1, min(wanted, allowed))


def spread_for(
    fleet: Fleet,
    policy: MaintenancePolicy,
    spread: Spread | None,
    items: int,
    name: str,
    workers: int | None = None,
) -> Spread | None:
    """Where pass ``name`` runs its per-store work over ``items`` items: ``spread`` if given
    (``--on-spark``), else :class:`HostProcesses` if :func:`process_count` gives more than
    one for the policy's ``processes`` (``workers``, else the policy's, threads a process),
    else None: threads here. A fleet
    whose storage opener cannot be pickled (a closure) keeps to threads: the processes could
    not open its storage the same way."""
    if spread is not None:
        return spread
    threads = workers or policy.workers or PROCESS_THREADS
    count = process_count(policy.processes, fleet.catalog.dialect, items, threads)
    if count <= 1 or not _picklable(fleet.open_storage):
        return None
    url = fleet.catalog.engine.url.render_as_string(hide_password=False)
    return HostProcesses(url, count, name, threads)


def _picklable(value: object) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class HostProcesses:
    """Deals a pass's items to ``processes`` worker processes on this host, each running
    ``threads`` threads on a catalog of its own at ``catalog_url``; ``name`` (the pass) names
    a process lost in the error."""

    catalog_url: str = field(repr=False)  # its password too
    processes: int
    name: str = "maintenance"
    threads: int = PROCESS_THREADS

    def map(
        self, fleet: Fleet, items: Sequence[Item], work: Work[Item, Result]
    ) -> Iterator[Result]:
        """The results of ``work`` over ``items``, a slice's as it finishes (in no set
        order), at most :data:`IN_FLIGHT` slices a process dealt ahead. A slice that raises
        (or a Ctrl-C) stops the map: the slices still queued here are cancelled, those the
        processes run or were handed (up to ``processes`` + 1 more) finish, the error is
        raised as the process raised it; a process lost raises WorkerProcessLost."""
        if not items:
            return
        size = max(1, min(SLICE_ITEMS, -(-len(items) // (IN_FLIGHT * self.processes))))
        roots = None if fleet.roots is None else list(fleet.roots)
        pool = ProcessPoolExecutor(
            self.processes,
            mp_context=_context(),
            initializer=_start,
            initargs=(self.catalog_url, self.threads, roots, fleet.owner, fleet.open_storage),
        )
        task = partial(_slice, work)
        running: set[Future[list[Result]]] = set()
        try:
            for start in range(0, len(items), size):
                if len(running) >= IN_FLIGHT * self.processes:
                    done, running = wait(running, return_when=FIRST_COMPLETED)
                    yield from _results(done)
                running.add(pool.submit(task, list(items[start : start + size])))
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                yield from _results(done)
        except BrokenProcessPool as exc:  # a slice's result, or dealing the next one
            raise WorkerProcessLost(
                f"the {self.name} pass lost one of its {self.processes} worker processes "
                f"({_why_lost(exc)}) while working on its {len(items)} stores or chunks; the "
                "stores it held are leased until their leases expire, and the next run "
                "takes them up"
            ) from exc
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _results(done: set[Future[list[Result]]]) -> Iterator[Result]:
    """The results of finished slices; a slice's error raised as its process raised it."""
    for future in done:
        yield from future.result()


def _why_lost(broken: BrokenProcessPool) -> str:
    """Why the pool broke: what a process sent back could not be read here (the executor
    gives the error that reading raised as the cause; the pool is stopped all the same), or
    else a process ended."""
    if broken.__cause__ is None:
        return "killed, out of memory, or it exited"
    lines = [line for line in str(broken.__cause__).splitlines() if line.strip("' ")]
    return f"it sent back what the driver could not read: {lines[-1] if lines else '?'}"


_OPENING: tuple[str, int, list[str] | None, str, StorageOpener] | None = None
"""What a worker process opens its fleet with (:func:`worker_fleet`'s arguments)."""
_FLEET: Fleet | None = None
"""A worker process's fleet, opened by its first slice (:func:`_fleet`) for every slice."""


def _start(
    url: str, threads: int, roots: list[str] | None, owner: str, opener: StorageOpener
) -> None:
    """A worker process's start: what its fleet opens with kept, and a watch on the driver,
    so that the process ends with it. The fleet is opened by the first slice, not here: an
    initializer that raises only ends its process (the error is logged in the process, the
    driver sees a process lost), where a slice's error comes back to the driver as raised."""
    global _OPENING
    threading.Thread(target=_end_with_driver, name="driver-watch", daemon=True).start()
    _OPENING = (url, threads, roots, owner, opener)


def _fleet() -> Fleet:
    """This worker process's fleet, opened once (by its first slice) and closed when the
    process ends; a catalog that does not open (gone, its connections exhausted) fails
    the slice with the catalog's error."""
    global _FLEET
    if _FLEET is None:
        assert _OPENING is not None, "a worker process runs slices once started"
        opened = ExitStack()
        fleet = opened.enter_context(worker_fleet(*_OPENING))
        Finalize(fleet, opened.close, exitpriority=10)
        _FLEET = fleet
    return _FLEET


def _end_with_driver() -> None:
    """Ends this worker process when the driver does, however it does: a driver killed
    (SIGKILL, the OOM killer) never shuts its executor down, and its worker processes would
    wait on its queue forever, holding their catalog connections. The driver's sentinel (a
    pipe it holds, under ``forkserver`` as under ``spawn``) becomes ready when it is gone."""
    driver = multiprocessing.parent_process()
    if driver is not None:
        wait_ready([driver.sentinel])
        os._exit(1)


def _slice(work: Work[Item, Result], items: list[Item]) -> list[Result]:
    """A worker process's slice, on its fleet; the results sent back whole."""
    return list(work(_fleet(), items))


def _context() -> multiprocessing.context.BaseContext:
    """``forkserver`` (its server has imported the passes, so a process starts in
    milliseconds), else ``spawn``: never ``fork``, which would copy the driver's threads and
    pooled connections."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context
