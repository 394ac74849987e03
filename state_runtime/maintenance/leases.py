"""Per-store maintenance leases held around a block: what was taken, what another run holds.

Leases for many stores are taken, renewed and given back in one catalog call each
(:meth:`Catalog.acquire_leases <state_runtime.catalog.Catalog.acquire_leases>`), so a pass over
thousands of stores does not pay a round trip and a commit per store. A block that works on
its stores one after another may outlast the leases' time to live: it calls
:meth:`Held.renew` between stores, so that no other run takes a store it still works on. The
leases a recorded run holds to its close (a restore's, a repartition's: one long step may
outlast them) are renewed by the run's heartbeat thread (``maintenance.runs``) instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from state_runtime.catalog import Catalog, Lease, StoreKey
from state_runtime.errors import MaintenanceRefused


@dataclass
class Held:
    """Stores whose leases this run holds, stores another run holds, and stores whose lease
    this run lost (it ran out before a renewal and another run took it)."""

    catalog: Catalog
    ttl: timedelta
    leases: list[Lease] = field(default_factory=list)
    busy: list[StoreKey] = field(default_factory=list)
    lost: list[StoreKey] = field(default_factory=list)
    renewed_at: float = field(default_factory=time.monotonic)
    """When (``time.monotonic``) the leases were taken or last renewed."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Serializes renewals (a heartbeat thread's) with absorbing more leases."""

    @classmethod
    def taken(
        cls,
        catalog: Catalog,
        ttl: timedelta,
        keys: Sequence[StoreKey],
        taken: Sequence[Lease | None],
    ) -> Held:
        """The leases taken for ``keys`` (in their order; None: another run holds it)."""
        held = cls(catalog, ttl)
        for key, lease in zip(keys, taken, strict=True):
            if lease is None:
                held.busy.append(key)
            else:
                held.leases.append(lease)
        return held

    def absorb(self, other: Held) -> None:
        """Hold ``other``'s leases too (and report its busy and lost stores): one set that the
        run's close gives back whole. Renewals go by the older of the two takings."""
        with self._lock:
            self._absorb(other)

    def _absorb(self, other: Held) -> None:
        self.leases += other.leases
        self.busy += other.busy
        self.lost += other.lost
        self.ttl = min(self.ttl, other.ttl)
        self.renewed_at = min(self.renewed_at, other.renewed_at)

    @property
    def keys(self) -> list[StoreKey]:
        return [lease.key for lease in self.leases]

    def renew(self) -> None:
        """Extend the held leases by their time to live (one transaction) once a third of it
        has passed since they were taken or last renewed (more often costs commits, less
        risks a slow store outrunning them). A lease lost meanwhile (it ran out and another
        run took it) moves from ``leases`` to ``lost``: the caller stops working on its store.
        Safe to call from another thread than the one that absorbs leases."""
        with self._lock:
            self._renew(due=self.ttl.total_seconds() / 3)

    def _renew(self, due: float) -> None:
        started = time.monotonic()
        if not self.leases or started - self.renewed_at < due:
            return
        renewed = self.catalog.renew_leases(self.leases, self.ttl)
        self.renewed_at = started  # each expiry is at least ``ttl`` past this
        self.lost += [old.key for old, new in zip(self.leases, renewed, strict=True) if new is None]
        self.leases = [new for new in renewed if new is not None]

    def ensure_kept(self, doing: str) -> None:
        """Renew the leases now (one transaction), then MaintenanceRefused if one was lost
        (it ran out and another run took the store, which may be working on it): ``doing``
        (a switch) must not go on. Renewed, they last a time to live past this check."""
        with self._lock:
            self._renew(due=0)
            lost = list(self.lost)
        if lost:
            raise MaintenanceRefused(
                f"{len(lost)} store lease(s) ran out and passed to another maintenance run "
                f"(e.g. {lost[0]}) before {doing}, which was not done: run it again once "
                "that run ends"
            )


def lease_order(keys: Sequence[StoreKey]) -> list[StoreKey]:
    """``keys`` once each, in the one order every taker uses: no lock-order deadlocks."""
    return sorted(set(keys), key=str)


def take(
    catalog: Catalog, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
) -> Held:
    """Take the free leases among ``keys`` for run ``run_id`` (one transaction, lease order)."""
    ordered = lease_order(keys)
    return Held.taken(catalog, ttl, ordered, catalog.acquire_leases(ordered, owner, ttl, run_id))


@contextmanager
def leased(
    catalog: Catalog, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
) -> Iterator[Held]:
    """Take every free lease among ``keys`` for the block; skip (and report) the taken ones."""
    held = take(catalog, keys, owner, ttl, run_id)
    try:
        yield held
    finally:
        if held.leases:
            catalog.release_leases(held.leases)
