"""Maintenance runs as the catalog records them: started, then succeeded or failed, with counts.

Before a run starts, in the transaction that starts it, runs left ``running`` by a process that
died are closed as ``abandoned`` (see ``state_runtime.catalog.sql.runs_and_leases``); while it
runs, a heartbeat thread shows it alive and renews the leases it holds to its close, so that a
step longer than their time to live (a restore's bases, a repartition's Spark job) keeps them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from state_runtime.catalog import HEARTBEAT_INTERVAL, Catalog, Lease, RunKind, RunOutcome, StoreKey
from state_runtime.errors import CatalogUnavailable, StateStoreError
from state_runtime.maintenance.leases import Held, lease_order, take
from state_runtime.redaction import get_logger, redact

log = get_logger(__name__)


@dataclass
class RunRecord:
    """An open run: its id, the counts it will be closed with, and the leases its close
    gives back (taken at its start or by :func:`hold_until_close`)."""

    run_id: int
    counts: dict[str, Any] = field(default_factory=dict)
    held: Held | None = None

    @property
    def busy(self) -> list[StoreKey]:
        """The stores whose leases the run asked for and another run holds."""
        return [] if self.held is None else self.held.busy


@contextmanager
def recorded_run(
    catalog: Catalog,
    kind: RunKind,
    owner: str,
    parameters: dict[str, Any],
    status_limits: Mapping[str, int] | None,
    *,
    leases: Sequence[StoreKey] = (),
    lease_ttl: timedelta | None = None,
) -> Iterator[RunRecord]:
    """Record a run around a block: 'succeeded' when it ends, 'failed' with the error if not;
    the transaction that closes it gives back its held leases and records the run's stores
    whose status (under ``status_limits``; None: a run that records them itself) changed.

    One transaction closes the abandoned runs, starts this one and takes the free leases
    among ``leases`` (for ``lease_ttl``: a pass that knows its stores; ``run.held``, its
    ``busy`` the stores another run holds); a heartbeat thread keeps the run visibly alive
    and renews ``run.held`` (:func:`_heartbeat`; a pass that takes its leases later, by
    :func:`hold_until_close`, gives ``lease_ttl`` too, so that the thread wakes in time). The
    block calls ``held.ensure_kept`` before a step that needs its stores still leased.
    If taking them fails (an unknown store), the run is still recorded, as failed."""
    ordered = lease_order(leases)
    try:
        started = catalog.begin_run(kind.value, owner, parameters, leases=ordered, ttl=lease_ttl)
    except StateStoreError as exc:
        if ordered and not isinstance(exc, CatalogUnavailable):  # recording it would fail too
            _record_failed_start(catalog, kind, owner, parameters, exc)
        raise
    for gone in started.abandoned:
        log.warning("closed run %d (%s by %s): %s", gone.run_id, gone.kind, gone.owner, gone.error)
    run = RunRecord(started.run_id)
    if ordered and lease_ttl is not None:
        run.held = Held.taken(catalog, lease_ttl, ordered, started.leases)
    with _heartbeat(catalog, run, lease_ttl):
        try:
            yield run
        except BaseException as exc:
            catalog.finish_run(
                run.run_id,
                RunOutcome.FAILED.value,
                run.counts,
                redact(f"{type(exc).__name__}: {exc}"),
                status_limits=status_limits,
                release=_held(run),
            )
            raise
    catalog.finish_run(
        run.run_id,
        RunOutcome.SUCCEEDED.value,
        run.counts,
        status_limits=status_limits,
        release=_held(run),
    )


def hold_until_close(
    catalog: Catalog, run: RunRecord, keys: Sequence[StoreKey], owner: str, ttl: timedelta
) -> Held:
    """Take the free leases among ``keys`` for ``run`` (one transaction), held until the run's
    close gives them back in its own transaction: for a pass that learns its stores only
    once it runs and works on them to its end (one commit fewer than :func:`leased`).
    They join the leases the run already holds (taken at its start or by an earlier call)
    and its heartbeat renews them; the run's :class:`Held` is returned, ``busy`` the stores
    another run holds."""
    mine = set() if run.held is None else set(run.held.keys)
    taken = take(catalog, [key for key in keys if key not in mine], owner, ttl, run.run_id)
    if run.held is None:
        run.held = taken
    else:
        run.held.absorb(taken)
    return run.held


def _record_failed_start(
    catalog: Catalog, kind: RunKind, owner: str, parameters: dict[str, Any], exc: Exception
) -> None:
    """Record a run whose start (with its leases, one transaction) rolled back as failed with
    ``exc``, so that the run history shows it (two transactions, on this error path only)."""
    try:
        run_id = catalog.start_run(kind.value, owner, parameters)
        error = redact(f"{type(exc).__name__}: {exc}")
        catalog.finish_run(run_id, RunOutcome.FAILED.value, {}, error, status_limits=None)
    except StateStoreError as recording:  # the caller raises the start's own error
        log.warning("could not record the failed %s run by %s: %s", kind.value, owner, recording)


def _held(run: RunRecord) -> list[Lease]:
    """The leases the run holds now (renewed ones as renewed; lost ones not)."""
    return [] if run.held is None else run.held.leases


@contextmanager
def _heartbeat(catalog: Catalog, run: RunRecord, lease_ttl: timedelta | None) -> Iterator[None]:
    """Beat every HEARTBEAT_INTERVAL and renew ``run.held`` once a third of its leases' time
    to live has passed (:meth:`Held.renew`), whatever the block is doing; a lease lost anyway
    (the catalog unreachable for two thirds of it) is in ``run.held.lost``."""
    stop = threading.Event()

    def beat() -> None:
        beaten = time.monotonic()
        while not stop.wait(_wake_every(run, lease_ttl).total_seconds()):
            if run.held is not None:
                try:
                    run.held.renew()  # when due
                except StateStoreError as exc:  # the next wake tries again
                    log.warning("maintenance run %d: renewing leases failed: %s", run.run_id, exc)
            if time.monotonic() - beaten < HEARTBEAT_INTERVAL.total_seconds():
                continue
            try:
                catalog.heartbeat(run.run_id)
                beaten = time.monotonic()
            except StateStoreError as exc:  # the next beat tries again; the run goes on
                log.warning("maintenance run %d: heartbeat failed: %s", run.run_id, exc)

    thread = threading.Thread(target=beat, name=f"run-{run.run_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _wake_every(run: RunRecord, lease_ttl: timedelta | None) -> timedelta:
    """How often the heartbeat thread wakes: its interval, or a sixth of the leases' time to
    live if shorter (so that a renewal, due after a third of it, comes before half of it)."""
    ttls = [t for t in (lease_ttl, None if run.held is None else run.held.ttl) if t is not None]
    return min([HEARTBEAT_INTERVAL] + [t / 6 for t in ttls])
