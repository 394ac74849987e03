"""Maintenance runs and per-store leases (mutual exclusion of maintenance across processes).

A lease is a row in ``store_leases``: whoever inserts it (or takes over an expired one) holds
the store until releasing it or until it expires, so a crashed run never blocks a store for
longer than its time to live. Long runs renew their lease. Holders compare their token, so a
run whose lease expired and was taken over cannot release or renew the new holder's lease.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.inventory import AnyRow, insert_ignoring, mark_maintained, store_ids
from state_runtime.catalog.records import Lease, MaintenanceRun, StoreKey
from state_runtime.catalog.tables import RunKind, RunOutcome, maintenance_runs, store_leases
from state_runtime.errors import CatalogError, InvalidArgument, MaintenanceRefused


def start_run(
    connection: Connection, kind: str, owner: str, parameters: dict[str, Any], now: datetime
) -> int:
    """Record a maintenance run as running; return its id."""
    try:
        kind = RunKind(kind).value
    except ValueError:
        raise InvalidArgument(
            f"unknown maintenance run kind {kind!r}; one of {[k.value for k in RunKind]}"
        ) from None
    if not owner:
        raise InvalidArgument("a maintenance run needs an owner (who or what runs it)")
    run_id = connection.execute(
        sa.insert(maintenance_runs)
        .values(
            kind=kind,
            owner=owner,
            parameters=parameters,
            started_at=now,
            outcome=RunOutcome.RUNNING.value,
            counts={},
        )
        .returning(maintenance_runs.c.run_id)
    ).scalar_one()
    return int(run_id)


def finish_run(
    connection: Connection,
    run_id: int,
    outcome: str,
    counts: dict[str, Any],
    error: str | None,
    now: datetime,
) -> None:
    """Close a running run with its outcome and counts; finishing twice is an error."""
    if outcome not in (RunOutcome.SUCCEEDED.value, RunOutcome.FAILED.value):
        raise InvalidArgument(f"a run finishes as 'succeeded' or 'failed', not {outcome!r}")
    r = maintenance_runs.c
    done = connection.execute(
        sa.update(maintenance_runs)
        .where(r.run_id == run_id, r.outcome == RunOutcome.RUNNING.value)
        .values(outcome=outcome, counts=counts, error=error, ended_at=now)
    ).rowcount
    if done != 1:
        raise CatalogError(f"maintenance run {run_id} is unknown or already finished")


def get_run(connection: Connection, run_id: int) -> MaintenanceRun | None:
    row = connection.execute(
        sa.select(maintenance_runs).where(maintenance_runs.c.run_id == run_id)
    ).first()
    return None if row is None else _run(row)


def recent_runs(connection: Connection, limit: int) -> list[MaintenanceRun]:
    r = maintenance_runs.c
    rows = connection.execute(
        sa.select(maintenance_runs).order_by(r.started_at.desc(), r.run_id.desc()).limit(limit)
    )
    return [_run(row) for row in rows]


def _run(row: AnyRow) -> MaintenanceRun:
    return MaintenanceRun(
        run_id=row.run_id,
        kind=row.kind,
        owner=row.owner,
        parameters=row.parameters,
        started_at=row.started_at,
        ended_at=row.ended_at,
        outcome=row.outcome,
        counts=row.counts,
        error=row.error,
    )


def try_acquire_lease(
    connection: Connection,
    key: StoreKey,
    owner: str,
    ttl: timedelta,
    run_id: int | None,
    now: datetime,
) -> Lease | None:
    """Take the store's lease if it is free or expired; None if someone else holds it."""
    if ttl <= timedelta(0):
        raise InvalidArgument(f"lease time to live must be positive, got {ttl}")
    if not owner:
        raise InvalidArgument("a lease needs an owner")
    store_id = known_store_id(connection, key)
    token = uuid.uuid4().hex
    values = {
        "token": token,
        "owner": owner,
        "run_id": run_id,
        "acquired_at": now,
        "expires_at": now + ttl,
    }
    connection.execute(
        insert_ignoring(connection, store_leases).values(store_id=store_id, **values)
    )
    lease = store_leases.c
    taken = connection.execute(
        sa.update(store_leases)
        .where(
            lease.store_id == store_id,
            sa.or_(lease.token == token, lease.expires_at <= now),
        )
        .values(**values)
    ).rowcount
    if taken != 1:
        return None
    if run_id is not None:
        mark_maintained(connection, [store_id], run_id)
    return Lease(key=key, token=token, owner=owner, run_id=run_id, expires_at=now + ttl)


def known_store_id(connection: Connection, key: StoreKey) -> int:
    """The store's id; CatalogError if the catalog has never seen the store."""
    found = store_ids(connection, key.root, [key.store])
    if key.store not in found:
        raise CatalogError(f"unknown store {key}: no file of it was ever recorded", store=key.store)
    return found[key.store]


def lease_holder(connection: Connection, store_id: int) -> AnyRow | None:
    lease = store_leases.c
    return connection.execute(
        sa.select(lease.owner, lease.run_id, lease.expires_at).where(lease.store_id == store_id)
    ).first()


def renew_lease(
    connection: Connection, store_id: int, lease: Lease, ttl: timedelta, now: datetime
) -> Lease:
    """Extend a held lease; MaintenanceRefused if it expired and someone else took it."""
    c = store_leases.c
    renewed = connection.execute(
        sa.update(store_leases)
        .where(c.store_id == store_id, c.token == lease.token)
        .values(expires_at=now + ttl)
    ).rowcount
    if renewed != 1:
        raise MaintenanceRefused(
            f"lease on {lease.key} was lost (expired and taken over); stop working on the store",
            store=lease.key.store,
        )
    return Lease(lease.key, lease.token, lease.owner, lease.run_id, now + ttl)


def release_lease(connection: Connection, store_id: int, lease: Lease) -> bool:
    """Give the lease back; False if it had already expired and passed to someone else."""
    c = store_leases.c
    released = connection.execute(
        sa.delete(store_leases).where(c.store_id == store_id, c.token == lease.token)
    ).rowcount
    return bool(released == 1)
