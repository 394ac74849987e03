"""Cached versions of every provider in a process, within one memory budget.

Each provider keeps the versions it loaded or committed, so that a retried task reopens its
version without reading a file and a copy that is behind rolls forward. One budget in bytes
bounds them all together (a Spark Python worker holds many stores): past it, the least
recently used versions go first, whatever store they belong to. Versions of one store share
runs, and a run is counted once however many cached versions hold it. The version just used
is never evicted to make room for itself, so a store larger than the budget still keeps its
newest version.

The budget is ``STATE_CACHE_BYTES`` (bytes, or with a unit: ``512MiB``, ``2GiB``; default
2 GiB; declared in :data:`state_runtime.settings.WORKER`), read when first needed, or
:func:`set_budget`.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict, deque

from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef
from state_runtime.settings import WorkerSettings, parse_size
from state_runtime.store.disk_runs import LOCAL_DISK

__all__ = ["CACHE", "VersionCache", "parse_size", "set_budget"]
from state_runtime.store.run_levels import AnyRun, damaged
from state_runtime.store.versions import Version

Key = tuple[int, CheckpointRef]
"""A cached version: its owner (a provider) and its checkpoint."""

DISK_VERSIONS = 2
"""Cached versions a store keeps while they hold runs on local disk: those runs count only
their fence index against the budget, so this bounds the disk they hold (about twice the
store's state, docs/state-on-disk.md)."""


class VersionCache:
    """Least-recently-used versions of many providers, bounded by their bytes together."""

    def __init__(self, budget: int | None = None) -> None:
        self._lock = threading.Lock()
        self._budget = budget
        self._entries: OrderedDict[Key, Version] = OrderedDict()
        # Each owner's keys in the same recency order, so a put or a collected provider costs
        # its own versions, not every cached one (a worker may host hundreds of stores).
        self._by_owner: dict[int, OrderedDict[Key, None]] = {}
        self._owners = itertools.count()
        self._holders: dict[AnyRun, int] = {}  # run -> cached versions holding it
        self._used = 0
        self.evictions = 0
        # Owners whose provider was collected. The garbage collector may run a finalizer while
        # this very thread holds the lock, so finalizers only append here (atomic) and every
        # locked call sweeps.
        self._dead: deque[int] = deque()

    @property
    def budget(self) -> int:
        """The budget in bytes: as set, else ``STATE_CACHE_BYTES`` read on first use."""
        if self._budget is None:
            self._budget = WorkerSettings.from_env().cache_bytes
        return self._budget

    def register(self, holder: object) -> int:
        """An owner id for ``holder`` (a provider); its versions go when it is collected."""
        owner = next(self._owners)
        weakref.finalize(holder, self._dead.append, owner)
        return owner

    @property
    def used(self) -> int:
        """Bytes held by cached versions (shared runs once)."""
        with self._lock:
            self._sweep()
            return self._used

    def _sweep(self) -> None:
        """Forget the versions of collected owners (called with the lock held)."""
        while self._dead:
            self._forget(self._dead.popleft())

    def _forget(self, owner: int) -> None:
        for key in list(self._by_owner.get(owner, ())):
            self._release(self._pop(key))

    def _pop(self, key: Key) -> Version:
        mine = self._by_owner[key[0]]
        del mine[key]
        if not mine:
            del self._by_owner[key[0]]
        return self._entries.pop(key)

    def put(self, owner: int, version: Version, limit: int | None = None) -> None:
        """Cache ``version`` as the most recently used; evict past the budget, past ``limit``
        versions of this owner if given, and past :data:`DISK_VERSIONS` of its versions
        holding runs on disk."""
        key = (owner, version.ref)
        with self._lock:
            self._sweep()
            if key in self._entries:
                self._release(self._pop(key))
            self._entries[key] = version
            self._by_owner.setdefault(owner, OrderedDict())[key] = None
            for run in version.runs:
                if run not in self._holders:
                    self._used += run.nbytes
                self._holders[run] = self._holders.get(run, 0) + 1
            if limit is not None:
                mine = list(self._by_owner[owner])
                for old in mine[: max(0, len(mine) - limit)]:
                    self._evict(old)
            on_disk = [
                k
                for k in self._by_owner.get(owner, ())
                if any(run.on_disk for run in self._entries[k].runs)
            ]
            for old in on_disk[: max(0, len(on_disk) - DISK_VERSIONS)]:
                if old != key:
                    self._evict(old)
            while self._used > self.budget and len(self._entries) > 1:
                oldest = next(iter(self._entries))
                if oldest == key:
                    break
                self._evict(oldest)

    def get(self, owner: int, ref: CheckpointRef) -> Version | None:
        """A cached version (now the most recently used), or None; a version holding a run
        file that is damaged (found so by a read, or missing or of another length than
        written now: its files are checked outside the lock) is dropped instead, and loaded
        from storage by the caller."""
        key = (owner, ref)
        with self._lock:
            version = self._entries.get(key)
        if version is None:
            return None
        if damaged(version.runs):
            with self._lock:
                if self._entries.get(key) is version:
                    self._release(self._pop(key))  # not an eviction for room
            return None
        with self._lock:
            if self._entries.get(key) is version:
                self._entries.move_to_end(key)
                self._by_owner[owner].move_to_end(key)
        return version

    def refs(self, owner: int) -> list[CheckpointRef]:
        """The versions ``owner`` has cached, least recently used first."""
        with self._lock:
            return [ref for _, ref in self._by_owner.get(owner, ())]

    def drop(self, owner: int) -> None:
        """Forget every version of ``owner``."""
        with self._lock:
            self._sweep()
            self._forget(owner)

    def set_budget(self, budget: int) -> None:
        with self._lock:
            self._sweep()
            self._budget = budget
            while self._used > budget and len(self._entries) > 1:
                self._evict(next(iter(self._entries)))

    def _evict(self, key: Key) -> None:
        self._release(self._pop(key))
        self.evictions += 1

    def _release(self, version: Version) -> None:
        for run in version.runs:
            left = self._holders[run] - 1
            if left:
                self._holders[run] = left
            else:
                del self._holders[run]
                self._used -= run.nbytes


CACHE = VersionCache()
"""The process's cache: every provider shares it. Spark tasks set its budget to the value the
driver read (:class:`state_runtime.settings.WorkerSettings`)."""
LOCAL_DISK.budget = lambda: CACHE.budget  # runs on disk and the block cache take its quarters


def set_budget(budget: int) -> None:
    """Change this process's cache budget (bytes); evicts at once if it shrank."""
    if budget < 0:
        raise InvalidArgument(f"cache budget {budget} must not be negative")
    CACHE.set_budget(budget)
