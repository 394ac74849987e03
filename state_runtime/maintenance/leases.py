"""Per-store maintenance leases held around a block: what was taken, what another run holds.

Leases for many stores are taken (and given back) in one catalog call each
(:meth:`Catalog.acquire_leases <state_runtime.catalog.Catalog.acquire_leases>`), so a pass over
thousands of stores does not pay a round trip and a commit per store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from state_runtime.catalog import Catalog, Lease, StoreKey


@dataclass
class Held:
    """Stores whose leases this run holds, and stores another run holds."""

    leases: list[Lease] = field(default_factory=list)
    busy: list[StoreKey] = field(default_factory=list)

    @property
    def keys(self) -> list[StoreKey]:
        return [lease.key for lease in self.leases]


@contextmanager
def leased(
    catalog: Catalog, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
) -> Iterator[Held]:
    """Take every free lease among ``keys`` for the block; skip (and report) the taken ones."""
    ordered = sorted(set(keys), key=str)  # one order everywhere: no lock-order deadlocks
    held = Held()
    taken = catalog.acquire_leases(ordered, owner, ttl, run_id)
    for key, lease in zip(ordered, taken, strict=True):
        if lease is None:
            held.busy.append(key)
        else:
            held.leases.append(lease)
    try:
        yield held
    finally:
        if held.leases:
            catalog.release_leases(held.leases)
