"""Where a pass's per-store work runs when it is spread beyond this host's threads.

A pass (snapshots, validation, cleanup) has a driver part (what is due, the plan, the
recorded run, the report) and a per-store part (the work under the stores' leases). On one
host the per-store part runs in the pass's thread pool; given a :class:`Spread`, the pass
hands it its items (due stores, stores with their sample draws, chunks of stores) and a
``work`` function, and the spread deals the items to workers elsewhere: each worker opens
the catalog and the storage itself, runs ``work`` over its slice (the same function the
one-host path runs over the whole list, under the driver's run id), and the results come
back to the driver, which counts them into the pass's one report and one recorded run.
A worker runs ``work`` on the fleet of :func:`worker_fleet`, whichever the spread:
:class:`state_runtime.maintenance.spark.SparkSpread` (Spark tasks) and
:class:`state_runtime.maintenance.host_processes.HostProcesses` (this host's processes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

from state_runtime.catalog import Catalog
from state_runtime.maintenance.fleet import Fleet, StorageOpener
from state_runtime.maintenance.workers import RESERVED_CONNECTIONS
from state_runtime.storage import open_storage

Item = TypeVar("Item")
Result = TypeVar("Result")

Work = Callable[[Fleet, list[Item]], Iterable[Result]]
"""A pass's per-store work over a slice of its items: module-level (or a ``partial`` of
one), its items and results picklable, so that it travels to another process."""


class Spread(Protocol):
    """Runs a pass's per-store work over its items elsewhere (see the module docstring)."""

    def map(
        self, fleet: Fleet, items: Sequence[Item], work: Work[Item, Result]
    ) -> Iterator[Result]:
        """What ``work`` returned over every item, each slice's worker opening its own
        catalog and storage for ``fleet``'s roots, as ``fleet.owner``."""
        ...


@contextmanager
def worker_fleet(
    url: str,
    workers: int,
    roots: Sequence[str] | None,
    owner: str,
    opener: StorageOpener = open_storage,
) -> Iterator[Fleet]:
    """The fleet a spread's worker runs the pass's ``work`` on: a catalog of its own at
    ``url`` (a pool for ``workers`` threads and the run's reserved connections), each root's
    storage opened by ``opener`` (default: by its URI), as ``owner``; the catalog closed when
    the block ends."""
    with Catalog.open(url, connections=workers + RESERVED_CONNECTIONS) as catalog:
        yield Fleet(catalog, roots=roots, owner=owner, open_storage=opener)
