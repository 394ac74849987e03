"""Per-store maintenance leases held around a block: what was taken, what another run holds.

Leases for many stores are taken (and given back) in one catalog transaction per call, with
the catalog's own lease rules, so a pass over thousands of stores does not pay a round trip
and a commit per store. Lease tokens are made before the first attempt, so a retry after a
lost COMMIT finds the leases it took.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog, Lease, StoreKey
from state_runtime.catalog import runs as catalog_runs
from state_runtime.catalog.engine import run_transaction
from state_runtime.identity import new_checkpoint_id


@dataclass
class Held:
    """Stores whose leases this run holds, and stores another run holds."""

    leases: list[Lease] = field(default_factory=list)
    busy: list[StoreKey] = field(default_factory=list)

    @property
    def keys(self) -> list[StoreKey]:
        return [lease.key for lease in self.leases]


def _acquire(
    catalog: Catalog, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
) -> list[Lease | None]:
    tokens = [new_checkpoint_id() for _ in keys]  # before the first attempt: retries find them

    def work(connection: Connection) -> list[Lease | None]:
        now = datetime.now(UTC)
        return [
            catalog_runs.try_acquire_lease(connection, key, owner, ttl, run_id, token, now)
            for key, token in zip(keys, tokens, strict=True)
        ]

    return run_transaction(catalog.engine, work, retry=catalog.retry, what="acquire leases")


def _release(catalog: Catalog, leases: Sequence[Lease]) -> None:
    def work(connection: Connection) -> None:
        for lease in leases:
            store_id = catalog_runs.known_store_id(connection, lease.key)
            catalog_runs.release_lease(connection, store_id, lease)

    run_transaction(catalog.engine, work, retry=catalog.retry, what="release leases")


@contextmanager
def leased(
    catalog: Catalog, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
) -> Iterator[Held]:
    """Take every free lease among ``keys`` for the block; skip (and report) the taken ones."""
    ordered = sorted(set(keys), key=str)  # one order everywhere: no lock-order deadlocks
    held = Held()
    for key, lease in zip(ordered, _acquire(catalog, ordered, owner, ttl, run_id), strict=True):
        if lease is None:
            held.busy.append(key)
        else:
            held.leases.append(lease)
    try:
        yield held
    finally:
        if held.leases:
            _release(catalog, held.leases)
