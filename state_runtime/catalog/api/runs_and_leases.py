"""Catalog calls about maintenance runs and the per-store leases that keep them apart."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from state_runtime.catalog.api.transactions import CatalogBase
from state_runtime.catalog.records import Lease, MaintenanceRun, Position, StartedRun, StoreKey
from state_runtime.catalog.schema.tables import RunKind
from state_runtime.catalog.sql import runs_and_leases
from state_runtime.catalog.sql.status_changes import record_run_status_changes
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.identity import new_checkpoint_id
from state_runtime.status import DEFAULT_LIMITS


class RunCalls(CatalogBase):
    """Runs (recorded, heartbeat, abandoned) and store leases."""

    def start_run(self, kind: str, owner: str, parameters: dict[str, Any] | None = None) -> int:
        """Record a maintenance run ('snapshot', 'cleanup', 'validate', 'reconcile') with this
        host and process; its token, generated here, makes a retried call find its run."""
        token = new_checkpoint_id()
        return self._run(
            "start maintenance run",
            lambda c: runs_and_leases.start_run(
                c, kind, owner, dict(parameters or {}), token, self.now()
            ),
        )

    def begin_run(
        self,
        kind: str,
        owner: str,
        parameters: dict[str, Any] | None = None,
        *,
        leases: Sequence[StoreKey] = (),
        ttl: timedelta | None = None,
    ) -> StartedRun:
        """What a maintenance pass does first, in one transaction: close the abandoned runs
        (:meth:`close_abandoned_runs`), start its run (:meth:`start_run`) and take the free
        leases among ``leases`` for it (:meth:`acquire_leases`, for ``ttl``; a pass that knows
        its stores at its start). Each part finds what a retry's earlier attempt did (the run
        and the leases by their tokens, made here), so a lost COMMIT starts nothing twice."""
        token, lease_token = new_checkpoint_id(), new_checkpoint_id()
        if leases and ttl is None:
            raise InvalidArgument("leases taken at a run's start need a time to live")

        def work(connection: Connection) -> StartedRun:
            now = self.now()
            abandoned = runs_and_leases.close_abandoned_runs(connection, now)
            run_id = runs_and_leases.start_run(
                connection, kind, owner, dict(parameters or {}), token, now
            )
            taken = (
                runs_and_leases.acquire_leases(
                    connection, leases, owner, ttl, run_id, lease_token, now
                )
                if leases and ttl is not None
                else []
            )
            return StartedRun(run_id, abandoned, taken)

        return self._run("begin maintenance run", work)

    def finish_run(
        self,
        run_id: int,
        outcome: str,
        counts: dict[str, Any] | None = None,
        error: str | None = None,
        *,
        status_limits: Mapping[str, int] | None = DEFAULT_LIMITS,
        release: Sequence[Lease] = (),
    ) -> None:
        """Close a run as 'succeeded' or 'failed' with its counts (already closed that way:
        nothing to do), and in the same transaction give back the run's ``release`` leases
        (:meth:`release_leases`) and record each store of the run (whose last run it is:
        leased, a file recorded or deleted; validated since it started, for a validation)
        whose status (under ``status_limits``) changed; ``status_limits`` None: none (the
        run recorded them itself)."""

        def work(connection: Connection) -> None:
            now = self.now()
            runs_and_leases.finish_run(connection, run_id, outcome, dict(counts or {}), error, now)
            runs_and_leases.release_leases(connection, release)
            if status_limits is not None:
                record_run_status_changes(connection, status_limits, run_id, now)

        self._run("finish maintenance run", work)

    def heartbeat(self, run_id: int) -> bool:
        """Show that a running run is alive; False if it is no longer running."""
        return self._run(
            "run heartbeat", lambda c: runs_and_leases.heartbeat(c, run_id, self.now())
        )

    def close_abandoned_runs(self, *, now: datetime | None = None) -> list[MaintenanceRun]:
        """Close as 'abandoned' the runs left running by a process that died (see
        ``catalog.runs``); return them."""
        return self._run(
            "close abandoned runs",
            lambda c: runs_and_leases.close_abandoned_runs(c, now or self.now()),
        )

    def run(self, run_id: int) -> MaintenanceRun | None:
        return self._read(
            "read maintenance run", lambda c, v: runs_and_leases.get_run(c, v, run_id)
        )

    def recent_runs(self, limit: int = 50) -> list[MaintenanceRun]:
        return self._read(
            "read maintenance runs", lambda c, v: runs_and_leases.recent_runs(c, v, limit)
        )

    def runs_after(
        self, after: Position, *, limit: int = 50, newest: bool = False, settled: bool = True
    ) -> list[tuple[Position, MaintenanceRun]]:
        """Runs started after ``after`` (the first ``limit``; ``newest``: the last), in the
        order they became visible, with their positions: what a reader has not seen yet, each
        exactly once (``sql/positions.py``: only once their transactions ended). Not
        ``settled``: every run visible now, even above an older transaction still open (what
        happened since, to name; not a cursor's next runs)."""
        return self._read(
            "read maintenance runs",
            lambda c, v: runs_and_leases.runs_after(c, v, after, limit, newest, settled),
        )

    def try_acquire_lease(
        self, key: StoreKey, owner: str, ttl: timedelta, *, run_id: int | None = None
    ) -> Lease | None:
        """Take the store's maintenance lease, or None if another holder has it."""
        token = new_checkpoint_id()
        return self._run(
            "acquire lease",
            lambda c: runs_and_leases.acquire_leases(
                c, [key], owner, ttl, run_id, token, self.now()
            )[0],
        )

    def renew_lease(self, lease: Lease, ttl: timedelta) -> Lease:
        return self._run(
            "renew lease", lambda c: runs_and_leases.renew_lease(c, lease, ttl, self.now())
        )

    def renew_leases(self, leases: Sequence[Lease], ttl: timedelta) -> list[Lease | None]:
        """Extend ``leases`` to ``ttl`` from now in one transaction of a statement or two (a
        pass holding a chunk's leases renews them all with one commit): each renewed, or None
        where it was lost (it expired and another holder took it)."""
        return self._run(
            "renew leases",
            lambda c: runs_and_leases.extend_leases(c, leases, ttl, self.now()),
        )

    def release_lease(self, lease: Lease) -> bool:
        return self._run("release lease", lambda c: runs_and_leases.release_lease(c, lease))

    @contextlib.contextmanager
    def store_lease(
        self, key: StoreKey, owner: str, ttl: timedelta, *, run_id: int | None = None
    ) -> Iterator[Lease]:
        """Hold the store's maintenance lease for a block; MaintenanceRefused if it is taken.
        Two transactions, as a lease held across a block must be: one takes the lease (or
        reads who holds it), one gives it back."""
        token = new_checkpoint_id()

        def take(connection: Connection) -> tuple[Lease | None, Any]:
            now = self.now()
            (lease,) = runs_and_leases.acquire_leases(
                connection, [key], owner, ttl, run_id, token, now
            )
            if lease is not None:
                return lease, None
            store_id = runs_and_leases.known_store_id(connection, key)
            return None, runs_and_leases.lease_holder(connection, store_id)

        lease, holder = self._run("acquire lease", take)
        if lease is None:
            who = "another run" if holder is None else f"{holder.owner} (run {holder.run_id})"
            until = "" if holder is None else f" until {holder.expires_at.isoformat()}"
            raise MaintenanceRefused(
                f"store {key} is being maintained by {who}{until}", store=key.store
            )
        try:
            yield lease
        finally:
            self.release_lease(lease)

    def previous_run_counts(
        self, kind: RunKind, scope: str, before_run_id: int
    ) -> dict[str, Any] | None:
        """The counts of the newest succeeded run of ``kind`` over the same ``scope`` (its
        ``parameters["scope"]``) that started before run ``before_run_id``."""
        return self._read(
            "read previous run",
            lambda c, v: runs_and_leases.previous_run_counts(c, v, kind, scope, before_run_id),
        )

    def acquire_leases(
        self, keys: Sequence[StoreKey], owner: str, ttl: timedelta, run_id: int
    ) -> list[Lease | None]:
        """Take the free leases among ``keys`` in one transaction of a few set-based statements
        (None for a taken one), so that a pass over thousands of stores pays neither a commit
        nor a round trip per store. The leases share one token, made before the first attempt:
        a retry after a lost COMMIT finds the leases it took."""
        token = new_checkpoint_id()
        return self._run(
            "acquire leases",
            lambda c: runs_and_leases.acquire_leases(
                c, keys, owner, ttl, run_id, token, self.now()
            ),
        )

    def release_leases(self, leases: Sequence[Lease]) -> None:
        """Give back ``leases`` in one transaction (one statement a token and chunk)."""
        self._run("release leases", lambda c: runs_and_leases.release_leases(c, leases))
