"""Maintenance runs and per-store leases (mutual exclusion of maintenance across processes).

A lease is a row in ``store_leases``: whoever inserts it (or takes over an expired one) holds
the store until releasing it or until it expires, so a crashed run never blocks a store for
longer than its time to live. Long runs renew their leases (the snapshot pass between stores:
``maintenance.leases.Held.renew``; a restore's or repartition's run, its heartbeat thread).
Holders compare their token, so a run whose lease expired and was taken over cannot release
or renew the new holder's lease.

Every function here is safe to run twice (the transaction helper retries a COMMIT whose answer
was lost): runs and leases carry a token the client generated before the first attempt, so a
retry finds what its earlier attempt did, and "already in the state asked for" is success.

A run records the host and process that run it and a heartbeat. A run still ``running`` whose
process is gone (same host, no such process) or whose heartbeat is older than
``ABANDON_AFTER`` is closed as ``abandoned``, with the reason, by the next maintenance pass.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import Lease, MaintenanceRun, Position, StoreKey
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import RunKind, RunOutcome, maintenance_runs, store_leases
from state_runtime.catalog.sql.lookups import mark_maintained, store_ids
from state_runtime.catalog.sql.positions import WritingTransaction, later_than, settled_after
from state_runtime.catalog.sql.rows import AnyRow
from state_runtime.catalog.sql.statements import among, chunks, dialect_insert
from state_runtime.errors import CatalogError, InvalidArgument, MaintenanceRefused
from state_runtime.identity import validate_non_negative

HEARTBEAT_INTERVAL = timedelta(seconds=30)
"""How often a running run refreshes its heartbeat."""
ABANDON_AFTER = timedelta(minutes=5)
"""A run whose heartbeat is this old is abandoned, wherever it ran."""
_FINISHED = (RunOutcome.SUCCEEDED.value, RunOutcome.FAILED.value)


def this_host() -> str:
    """This machine and process namespace: a pid is meaningful only within both."""
    try:
        namespace = f"#pidns:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}{namespace}"


@dataclasses.dataclass(frozen=True)
class _Statements:
    """The statements every maintenance run executes (its start and finish, the sweep of
    abandoned runs, its leases), built once per dialect: their values are bind parameters (a
    chunk's store ids one list, ``store_ids``: an array on PostgreSQL, :func:`among`)."""

    start: Any
    run_of_token: sa.Select[Any]
    finish: sa.Update
    running: sa.Select[Any]
    take: Any
    extend: sa.Update
    release: sa.Delete


_LEASE_VALUES = ("token", "owner", "run_id", "acquired_at", "expires_at")
"""A lease's columns besides its store: what taking it (over) sets."""


@functools.cache
def _statements(dialect: str) -> _Statements:
    r, lease = maintenance_runs.c, store_leases.c
    token = sa.bindparam("lease_token", type_=lease.token.type)  # not "token": a SET column
    ours = [among(dialect, lease.store_id, "store_ids"), lease.token == token]
    unfinished = [constant(RunOutcome.RUNNING), constant(RunOutcome.ABANDONED)]
    ended = sa.bindparam("ended", type_=r.ended_at.type)
    insert = dialect_insert(dialect, store_leases)
    excluded = insert.excluded
    return _Statements(
        # Its transaction's id written too, though also the column's default on PostgreSQL.
        # Returning the new run's id: one statement, unless a retry finds its run by token.
        start=dialect_insert(dialect, maintenance_runs)
        .on_conflict_do_nothing()
        .values(xact_id=WritingTransaction())
        .returning(r.run_id),
        run_of_token=sa.select(r.run_id).where(r.run_token == sa.bindparam("token")),
        # Its end never before its start: a run started through one reading of the database's
        # clock may finish through another (another process, or a reading taken again) that
        # runs a little behind it.
        finish=sa.update(maintenance_runs)
        .where(r.run_id == sa.bindparam("run", type_=r.run_id.type), r.outcome.in_(unfinished))
        .values(ended_at=sa.case((r.started_at > ended, r.started_at), else_=ended)),
        running=sa.select(maintenance_runs).where(r.outcome == constant(RunOutcome.RUNNING)),
        # A free store's row inserted; an expired one, or our own (a retry), taken over.
        take=insert.on_conflict_do_update(
            index_elements=[lease.store_id],
            set_={name: getattr(excluded, name) for name in _LEASE_VALUES},
            where=sa.or_(lease.token == excluded.token, lease.expires_at <= excluded.acquired_at),
        ).returning(lease.store_id),
        extend=sa.update(store_leases)
        .where(*ours)
        .values(expires_at=sa.bindparam("expires", type_=lease.expires_at.type))
        .returning(lease.store_id),
        release=sa.delete(store_leases).where(*ours),
    )


def start_run(
    connection: Connection,
    kind: str,
    owner: str,
    parameters: dict[str, Any],
    token: str,
    now: datetime,
) -> int:
    """Record a maintenance run as running, or find the one ``token`` already started;
    return its id."""
    try:
        kind = RunKind(kind).value
    except ValueError:
        raise InvalidArgument(
            f"unknown maintenance run kind {kind!r}; one of {[k.value for k in RunKind]}"
        ) from None
    if not owner:
        raise InvalidArgument("a maintenance run needs an owner (who or what runs it)")
    started = connection.execute(
        _statements(connection.dialect.name).start,
        {
            "kind": kind,
            "owner": owner,
            "parameters": parameters,
            "started_at": now,
            "outcome": RunOutcome.RUNNING.value,
            "counts": {},
            "run_token": token,
            "host": this_host(),
            "pid": os.getpid(),
            "heartbeat_at": now,
        },
    ).scalar()
    if started is None:  # a retry after a lost COMMIT: the first attempt's run
        started = connection.execute(
            _statements(connection.dialect.name).run_of_token, {"token": token}
        ).scalar_one()
    return int(started)


def finish_run(
    connection: Connection,
    run_id: int,
    outcome: str,
    counts: dict[str, Any],
    error: str | None,
    now: datetime,
) -> None:
    """Close a run with its outcome and counts.

    A run already finished with this outcome is success (a retried call); finished with
    another outcome, or unknown, is CatalogError. A run closed as abandoned (it looked dead)
    that finishes after all gets its real outcome."""
    if outcome not in _FINISHED:
        raise InvalidArgument(f"a run finishes as 'succeeded' or 'failed', not {outcome!r}")
    validate_non_negative(run_id, "run id")
    r = maintenance_runs.c
    done = connection.execute(
        _statements(connection.dialect.name).finish,
        {"run": run_id, "outcome": outcome, "counts": counts, "error": error}
        | {"ended": now, "heartbeat_at": now},
    ).rowcount
    if done == 1:
        return
    found = connection.execute(sa.select(r.outcome).where(r.run_id == run_id)).scalar()
    if found == outcome:
        return
    if found is None:
        raise CatalogError(f"maintenance run {run_id} is unknown")
    raise CatalogError(f"maintenance run {run_id} is already finished: {found}")


def heartbeat(connection: Connection, run_id: int, now: datetime) -> bool:
    """Show that a run is alive; False if it is no longer running."""
    r = maintenance_runs.c
    return bool(
        connection.execute(
            sa.update(maintenance_runs)
            .where(r.run_id == run_id, r.outcome == constant(RunOutcome.RUNNING))
            .values(heartbeat_at=now)
        ).rowcount
    )


def close_abandoned_runs(connection: Connection, now: datetime) -> list[MaintenanceRun]:
    """Close as ``abandoned`` every running run whose process is gone (this host) or whose
    heartbeat is older than ABANDON_AFTER; return them as they are now."""
    r = maintenance_runs.c
    running = connection.execute(_statements(connection.dialect.name).running).all()
    host = this_host()
    closed: list[int] = []
    gone: list[int] = []
    for run in running:
        beat = run.heartbeat_at or run.started_at
        if run.host == host and run.pid is not None and not _alive(run.pid):
            why = f"abandoned: its process {run.pid} on {run.host} is gone"
            gone.append(run.run_id)
        elif now - beat > ABANDON_AFTER:
            why = f"abandoned: no heartbeat since {beat.isoformat()} (more than {ABANDON_AFTER})"
        else:
            continue
        changed = connection.execute(
            sa.update(maintenance_runs)
            .where(r.run_id == run.run_id, r.outcome == constant(RunOutcome.RUNNING))
            .values(
                outcome=RunOutcome.ABANDONED.value,
                ended_at=max(now, run.started_at),
                error=why if not run.error else f"{why}; {run.error}",
            )
        ).rowcount
        if changed:
            closed.append(run.run_id)
    if not closed:
        return []
    # A run whose process is known dead holds nothing any more: its leases go with it (a run
    # only silent may still be working somewhere; its leases run out by themselves).
    dead = [run_id for run_id in closed if run_id in gone]
    if dead:
        connection.execute(sa.delete(store_leases).where(store_leases.c.run_id.in_(dead)))
    rows = connection.execute(sa.select(maintenance_runs).where(r.run_id.in_(closed)))
    return [_run(row) for row in rows]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return True  # cannot tell: do not declare it dead
    return True


def get_run(connection: Connection, views: ReaderViews, run_id: int) -> MaintenanceRun | None:
    validate_non_negative(run_id, "run id")
    row = connection.execute(sa.select(views.runs).where(views.runs.c.run_id == run_id)).first()
    return None if row is None else _run(row)


def recent_runs(connection: Connection, views: ReaderViews, limit: int) -> list[MaintenanceRun]:
    validate_non_negative(limit, "limit")
    r = views.runs.c
    rows = connection.execute(
        sa.select(views.runs).order_by(r.started_at.desc(), r.run_id.desc()).limit(limit)
    )
    return [_run(row) for row in rows]


def runs_after(
    connection: Connection,
    views: ReaderViews,
    after: Position,
    limit: int,
    newest: bool,
    settled: bool,
) -> list[tuple[Position, MaintenanceRun]]:
    """Up to ``limit`` runs started after ``after`` whose transactions ended (``settled``:
    and every older one, an exact reader's cursor, ``positions.py``), the first ones
    (``newest``: the last ones), in position order, each with its position."""
    validate_non_negative(limit, "limit")
    r = views.runs.c
    order = (r.xact_id.desc(), r.run_id.desc()) if newest else (r.xact_id, r.run_id)
    after_it = (
        settled_after(connection, r.xact_id, r.run_id, after)
        if settled
        else later_than(r.xact_id, r.run_id, after)
    )
    query = sa.select(views.runs).where(after_it).order_by(*order).limit(limit)
    found = [(Position(row.xact_id, row.run_id), _run(row)) for row in connection.execute(query)]
    return found[::-1] if newest else found


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
        host=row.host,
        pid=row.pid,
        heartbeat_at=row.heartbeat_at,
    )


def acquire_leases(
    connection: Connection,
    keys: Sequence[StoreKey],
    owner: str,
    ttl: timedelta,
    run_id: int | None,
    token: str,
    now: datetime,
) -> list[Lease | None]:
    """Take the leases of ``keys`` that are free, expired, or already ours (``token``, one
    for the call: a retry after a lost COMMIT finds the leases its first attempt took); None
    for a store someone else holds. Set-based: the stores are read once, and each chunk of
    them is one upsert (a free store's row inserted, an expired or our own one taken over,
    each row written once) that returns the stores it took, whatever their number."""
    if ttl <= timedelta(0):
        raise InvalidArgument(f"lease time to live must be positive, got {ttl}")
    if not owner:
        raise InvalidArgument("a lease needs an owner")
    ids = known_store_ids(connection, keys)
    values = {
        "token": token,
        "owner": owner,
        "run_id": run_id,
        "acquired_at": now,
        "expires_at": now + ttl,
    }
    taken: set[int] = set()
    for part in chunks(sorted(set(ids.values()))):
        rows = connection.execute(  # one statement (insertmanyvalues), built once
            _statements(connection.dialect.name).take,
            [{"store_id": store_id, **values} for store_id in part],
        )
        taken.update(rows.scalars())
    if run_id is not None:
        mark_maintained(connection, taken, run_id)
    return [
        Lease(key, token, owner, run_id, now + ttl, ids[key]) if ids[key] in taken else None
        for key in keys
    ]


def known_store_ids(connection: Connection, keys: Sequence[StoreKey]) -> dict[StoreKey, int]:
    """The stores' ids (one read a root and chunk); CatalogError if the catalog has never seen
    one of them."""
    found: dict[StoreKey, int] = {}
    for root in sorted({key.root for key in keys}):
        ids = store_ids(connection, WRITE_LOOKUPS, root, [k.store for k in keys if k.root == root])
        found.update({StoreKey(root, store): store_id for store, store_id in ids.items()})
    for key in keys:
        if key not in found:
            raise CatalogError(
                f"unknown store {key}: no file of it was ever recorded", store=key.store
            )
    return found


def known_store_id(connection: Connection, key: StoreKey) -> int:
    """The store's id; CatalogError if the catalog has never seen the store."""
    return known_store_ids(connection, [key])[key]


def lease_holder(connection: Connection, store_id: int) -> AnyRow | None:
    lease = store_leases.c
    return connection.execute(
        sa.select(lease.owner, lease.run_id, lease.expires_at).where(lease.store_id == store_id)
    ).first()


def _by_token(leases: Sequence[Lease]) -> dict[str, list[int]]:
    """The leases' store ids by token (leases taken together share one)."""
    groups: dict[str, list[int]] = {}
    for lease in leases:
        groups.setdefault(lease.token, []).append(lease.store_id)
    return groups


def extend_leases(
    connection: Connection, leases: Sequence[Lease], ttl: timedelta, now: datetime
) -> list[Lease | None]:
    """The held leases extended to ``now + ttl``, each None where it was lost (it expired and
    someone else took it: its token no longer holds the store); one update (returning the
    stores it extended) a token and chunk."""
    kept: set[tuple[str, int]] = set()
    for token, ids in _by_token(leases).items():
        for part in chunks(sorted(ids)):
            held = connection.execute(
                _statements(connection.dialect.name).extend,
                {"store_ids": part, "lease_token": token, "expires": now + ttl},
            )
            kept.update((token, store_id) for store_id in held.scalars())
    return [
        dataclasses.replace(lease, expires_at=now + ttl)
        if (lease.token, lease.store_id) in kept
        else None
        for lease in leases
    ]


def renew_lease(connection: Connection, lease: Lease, ttl: timedelta, now: datetime) -> Lease:
    """Extend a held lease; MaintenanceRefused if it expired and someone else took it."""
    (renewed,) = extend_leases(connection, [lease], ttl, now)
    if renewed is None:
        raise MaintenanceRefused(
            f"lease on {lease.key} was lost (expired and taken over); stop working on the store",
            store=lease.key.store,
        )
    return renewed


def release_leases(connection: Connection, leases: Sequence[Lease]) -> int:
    """Give the leases back (one delete a token and chunk); how many were still ours (a lease
    that expired and passed to someone else, or that an earlier attempt of the call released,
    is not)."""
    released = 0
    for token, ids in _by_token(leases).items():
        for part in chunks(sorted(ids)):
            released += connection.execute(
                _statements(connection.dialect.name).release,
                {"store_ids": part, "lease_token": token},
            ).rowcount
    return released


def release_lease(connection: Connection, lease: Lease) -> bool:
    """Give the lease back: True once no lease of ours is held, also when an earlier attempt
    of this call released it; False if it had expired and passed to someone else."""
    return (
        bool(release_leases(connection, [lease]))
        or lease_holder(connection, lease.store_id) is None
    )


def previous_run_counts(
    connection: Connection, views: ReaderViews, kind: RunKind, scope: str, before_run_id: int
) -> dict[str, Any] | None:
    """The counts of the newest succeeded run of ``kind`` over the same ``scope`` (its
    ``parameters["scope"]``) that started before run ``before_run_id``."""
    r = views.runs.c
    rows = connection.execute(
        sa.select(r.parameters, r.counts)
        .where(
            r.kind == kind.value,
            r.outcome == constant(RunOutcome.SUCCEEDED),
            r.run_id < before_run_id,
        )
        .order_by(r.run_id.desc())
        .limit(50)
    )
    for row in rows:
        if (row.parameters or {}).get("scope") == scope:
            return dict(row.counts)
    return None
