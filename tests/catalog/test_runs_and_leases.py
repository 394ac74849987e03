"""Maintenance runs and per-store leases."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog, RunKind, StoreKey
from state_runtime.errors import CatalogError, InvalidArgument, MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.maintenance.runs import hold_until_close, recorded_run
from state_runtime.status import DEFAULT_LIMITS
from tests.catalog.conftest import FAST_RETRY
from tests.catalog.factory import ROOT, Stream
from tests.statements import statements

A = StoreId(0, 0)
KEY = StoreKey(ROOT, A)
TTL = timedelta(minutes=5)


def test_runs_are_recorded_and_closed_once(catalog: Catalog) -> None:
    run = catalog.start_run("cleanup", "dagster:run-1", {"retain_versions": 3})
    started = catalog.run(run)
    assert started is not None and started.outcome == "running" and started.ended_at is None
    catalog.finish_run(run, "failed", {"deleted": 4}, error="storage timeout")
    done = catalog.run(run)
    assert done is not None and done.outcome == "failed" and done.error == "storage timeout"
    assert done.counts == {"deleted": 4} and done.parameters == {"retain_versions": 3}
    assert done.ended_at is not None and done.ended_at >= done.started_at
    with pytest.raises(CatalogError, match="already finished"):
        catalog.finish_run(run, "succeeded")
    with pytest.raises(InvalidArgument, match="unknown maintenance run kind"):
        catalog.start_run("vacuum", "me")
    with pytest.raises(InvalidArgument, match="succeeded' or 'failed"):
        catalog.finish_run(run, "running")
    assert [r.run_id for r in catalog.recent_runs()] == [run]


def test_a_lease_excludes_others_until_released_or_expired(catalog: Catalog) -> None:
    Stream(catalog, [A]).commit()
    run = catalog.start_run("snapshot", "one")
    first = catalog.try_acquire_lease(KEY, "one", timedelta(seconds=30), run_id=run)
    assert first is not None
    assert catalog.try_acquire_lease(KEY, "two", timedelta(seconds=30)) is None
    with (
        pytest.raises(MaintenanceRefused, match=rf"being maintained by one \(run {run}\)"),
        catalog.store_lease(KEY, "two", timedelta(seconds=30)),
    ):
        pass
    assert catalog.release_lease(first)
    with catalog.store_lease(KEY, "two", timedelta(seconds=30)) as second:
        assert second.owner == "two"
        assert catalog.try_acquire_lease(KEY, "one", timedelta(seconds=30)) is None
    assert catalog.try_acquire_lease(KEY, "three", timedelta(milliseconds=200)) is not None

    time.sleep(0.3)  # the holder crashed: its lease expires and passes on
    taken = catalog.try_acquire_lease(KEY, "four", timedelta(seconds=30))
    assert taken is not None
    with pytest.raises(CatalogError, match="unknown store"):
        catalog.try_acquire_lease(StoreKey("/typo", A), "x", timedelta(seconds=1))


def test_a_run_holds_the_leases_taken_at_its_start_until_it_closes(catalog: Catalog) -> None:
    """Leases taken in a run's start transaction exclude other runs for the whole block and
    go with its close, failed or succeeded; another's held lease is reported busy."""
    b = StoreKey(ROOT, StoreId(0, 1))
    Stream(catalog, [A, b.store]).commit()
    with recorded_run(
        catalog, RunKind.RESTORE, "one", {}, DEFAULT_LIMITS, leases=[b, KEY], lease_ttl=TTL
    ) as first:
        assert first.held is not None and not first.busy
        assert [lease.key for lease in first.held.leases] == sorted([KEY, b], key=str)
        assert {lease.run_id for lease in first.held.leases} == {first.run_id}
        with (
            pytest.raises(MaintenanceRefused),
            recorded_run(
                catalog, RunKind.RESTORE, "two", {}, DEFAULT_LIMITS, leases=[KEY], lease_ttl=TTL
            ) as second,
        ):
            assert second.busy == [KEY]
            raise MaintenanceRefused("busy")
        assert catalog.try_acquire_lease(b, "three", TTL) is None
    assert _outcome(catalog, second.run_id) == "failed"
    assert _outcome(catalog, first.run_id) == "succeeded"
    with (
        pytest.raises(RuntimeError),
        recorded_run(
            catalog, RunKind.RESTORE, "four", {}, DEFAULT_LIMITS, leases=[KEY], lease_ttl=TTL
        ) as failing,
    ):
        assert failing.held is not None and len(failing.held.leases) == 1
        raise RuntimeError("the pass failed")
    assert _outcome(catalog, failing.run_id) == "failed"
    assert catalog.try_acquire_lease(KEY, "five", TTL) is not None


def test_leases_held_until_close_join_those_the_run_holds(catalog: Catalog) -> None:
    """Leases taken at the start and by each :func:`hold_until_close` call are one set: the
    close gives back every one of them, not only the last call's."""
    b, c = StoreKey(ROOT, StoreId(0, 1)), StoreKey(ROOT, StoreId(0, 2))
    Stream(catalog, [A, b.store, c.store]).commit()
    with recorded_run(
        catalog, RunKind.REPARTITION, "me", {}, DEFAULT_LIMITS, leases=[KEY], lease_ttl=TTL
    ) as run:
        hold_until_close(catalog, run, [KEY, b], "me", TTL)
        held = hold_until_close(catalog, run, [c], "me", TTL)
        assert held is run.held and not held.busy
        assert sorted(held.keys, key=str) == sorted([KEY, b, c], key=str)
    for key in (KEY, b, c):
        assert catalog.try_acquire_lease(key, "next", TTL) is not None


def test_a_run_whose_leases_cannot_be_taken_is_recorded_as_failed(catalog: Catalog) -> None:
    """Leases taken in the start's transaction roll it back when they fail (an unknown
    store): the run history still shows the run, failed with that error."""
    unknown = StoreKey(ROOT, StoreId(9, 9))
    with (
        pytest.raises(CatalogError, match="unknown store"),
        recorded_run(
            catalog, RunKind.RESTORE, "me", {}, DEFAULT_LIMITS, leases=[unknown], lease_ttl=TTL
        ),
    ):
        pass
    [run] = catalog.recent_runs()
    assert (run.kind, run.owner, run.outcome) == ("restore", "me", "failed")
    assert run.error is not None and "unknown store" in run.error


def _outcome(catalog: Catalog, run_id: int) -> str | None:
    run = catalog.run(run_id)
    return None if run is None else run.outcome


def test_a_lost_lease_cannot_be_renewed_or_released(catalog: Catalog) -> None:
    Stream(catalog, [A]).commit()
    old = catalog.try_acquire_lease(KEY, "slow", timedelta(milliseconds=100))
    assert old is not None
    time.sleep(0.2)
    new = catalog.try_acquire_lease(KEY, "fast", timedelta(seconds=30))
    assert new is not None
    with pytest.raises(MaintenanceRefused, match="was lost"):
        catalog.renew_lease(old, timedelta(seconds=30))
    assert not catalog.release_lease(old)
    renewed = catalog.renew_lease(new, timedelta(minutes=5))
    assert renewed.expires_at > new.expires_at
    assert catalog.try_acquire_lease(KEY, "slow", timedelta(seconds=30)) is None


def test_leases_are_renewed_together_and_a_lost_one_is_none(catalog: Catalog) -> None:
    b = StoreId(0, 1)
    Stream(catalog, [A, b]).commit()
    keys = [KEY, StoreKey(ROOT, b)]
    held = catalog.acquire_leases(
        keys, "slow", timedelta(milliseconds=100), catalog.start_run("snapshot", "slow")
    )
    assert all(lease is not None for lease in held)
    time.sleep(0.2)
    taken = catalog.try_acquire_lease(KEY, "fast", timedelta(seconds=30))  # the first passed on
    assert taken is not None
    lost, kept = catalog.renew_leases([h for h in held if h is not None], timedelta(minutes=5))
    assert lost is None and kept is not None and kept.token == held[1].token  # type: ignore[union-attr]
    assert catalog.try_acquire_lease(keys[1], "fast", timedelta(seconds=30)) is None
    assert catalog.renew_lease(taken, timedelta(minutes=5)).token == taken.token


def _lease_costs(catalog: Catalog, keys: list[StoreKey], run: int) -> tuple[int, int, int]:
    """The statements of taking, renewing and giving back the leases of ``keys``."""
    with statements(catalog.engine) as acquire:
        taken = catalog.acquire_leases(keys, "me", TTL, run)
    held = [lease for lease in taken if lease is not None]
    assert len(held) == len(keys)
    with statements(catalog.engine) as renew:
        assert None not in catalog.renew_leases(held, TTL)
    with statements(catalog.engine) as release:
        catalog.release_leases(held)
    return len(acquire), len(renew), len(release)


def test_a_chunk_of_leases_costs_the_same_statements_whatever_its_stores(
    catalog: Catalog,
) -> None:
    """Taking, renewing and giving back the leases of 4 stores or of 120 sends as many
    statements: set-based per chunk, no round trip per store (a fleet pass at 20,000 stores
    otherwise pays tens of thousands)."""
    few, many = [StoreId(0, p) for p in range(4)], [StoreId(1, p) for p in range(120)]
    Stream(catalog, few + many).commit()
    run = catalog.start_run("cleanup", "tests")
    costs = [
        _lease_costs(catalog, [StoreKey(ROOT, s) for s in stores], run) for stores in (few, many)
    ]
    assert costs[0] == costs[1]
    assert catalog.try_acquire_lease(StoreKey(ROOT, many[-1]), "x", TTL) is not None


def test_a_chunk_of_leases_is_one_upsert_and_on_postgresql_one_text(catalog: Catalog) -> None:
    """Taking a chunk's leases is one upsert returning the stores it took (it was an insert,
    an update of the rows just inserted and a read back: each new lease row written twice),
    renewing one update returning the stores it kept; on PostgreSQL the lease statements'
    text is the same for 4 stores or 120 (the store ids one array parameter, not an IN list
    of a parameter each)."""
    few, many = [StoreId(0, p) for p in range(4)], [StoreId(1, p) for p in range(120)]
    Stream(catalog, few + many).commit()
    run = catalog.start_run("cleanup", "tests")
    texts: list[list[str]] = []
    for stores in (few, many):
        keys = [StoreKey(ROOT, s) for s in stores]
        with statements(catalog.engine) as acquire:
            taken = catalog.acquire_leases(keys, "me", TTL, run)
        held = [lease for lease in taken if lease is not None]
        assert len(held) == len(keys)
        with statements(catalog.engine) as renew:
            assert None not in catalog.renew_leases(held, TTL)
        with statements(catalog.engine) as release:
            catalog.release_leases(held)
        leases = [t for t in acquire + renew + release if "store_leases" in t]
        assert len([t for t in acquire if "store_leases" in t]) == 1, acquire
        assert len([t for t in renew if "store_leases" in t]) == 1, renew
        texts.append(leases)
    if catalog.engine.dialect.name == "postgresql":
        assert texts[0][1:] == texts[1][1:]  # the renewal and the release (the upsert: rows)


HOLDER = """
import sys
from datetime import timedelta
from state_runtime.catalog import Catalog, StoreKey
from state_runtime.identity import StoreId
catalog = Catalog.open(sys.argv[1])
lease = catalog.try_acquire_lease(StoreKey(sys.argv[2], StoreId(0, 0)), "other-process",
                                  timedelta(seconds=60))
print("held" if lease else "refused")
"""


@pytest.mark.postgres
def test_a_lease_holds_across_processes(pg_catalog: Catalog) -> None:
    """Another process takes the lease and exits without releasing it (a crash)."""
    Stream(pg_catalog, [A]).commit()
    url = pg_catalog.engine.url.render_as_string(hide_password=False)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", HOLDER, url, ROOT],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "held"
    with (
        pytest.raises(MaintenanceRefused, match="other-process"),
        pg_catalog.store_lease(KEY, "me", timedelta(seconds=10)),
    ):
        pass
    other = Catalog.open(url, retry=FAST_RETRY)
    assert other.try_acquire_lease(KEY, "third", timedelta(seconds=10)) is None
    other.close()


def test_finishing_twice_the_same_way_is_success(catalog: Catalog) -> None:
    """A retried finish_run (its first COMMIT's answer lost) finds the run finished as asked."""
    run = catalog.start_run("cleanup", "me")
    catalog.finish_run(run, "succeeded", {"deleted": 3})
    catalog.finish_run(run, "succeeded", {"deleted": 3})
    done = catalog.run(run)
    assert done is not None and done.outcome == "succeeded" and done.counts == {"deleted": 3}
    with pytest.raises(CatalogError, match="already finished: succeeded"):
        catalog.finish_run(run, "failed")
    with pytest.raises(CatalogError, match="unknown"):
        catalog.finish_run(run + 1000, "failed")


def test_a_lease_retry_finds_its_own_lease_and_a_release_retry_is_success(
    catalog: Catalog,
) -> None:
    """What the catalog does when an attempt's COMMIT answer was lost and the call runs again
    with the same token: the lease is still its own, a second release is still a release."""
    from sqlalchemy.engine import Connection

    from state_runtime.catalog.connection.engine import run_transaction
    from state_runtime.catalog.sql import runs_and_leases

    Stream(catalog, [A]).commit()
    token = "f" * 32

    def acquire(connection: Connection) -> object:
        return runs_and_leases.acquire_leases(
            connection, [KEY], "me", timedelta(minutes=1), None, token, datetime.now(UTC)
        )[0]

    first = run_transaction(catalog.engine, acquire, retry=FAST_RETRY, what="acquire")
    again = run_transaction(catalog.engine, acquire, retry=FAST_RETRY, what="acquire")
    assert first is not None and again is not None
    assert catalog.try_acquire_lease(KEY, "other", timedelta(minutes=1)) is None
    assert catalog.release_lease(again) and catalog.release_lease(again)
    assert catalog.try_acquire_lease(KEY, "other", timedelta(minutes=1)) is not None


DOOMED = """
import sys, time
from state_runtime.catalog import Catalog, RunKind
from state_runtime.maintenance.runs import recorded_run
from state_runtime.status import DEFAULT_LIMITS
catalog = Catalog.open(sys.argv[1])
with recorded_run(catalog, RunKind.CLEANUP, "doomed", {}, DEFAULT_LIMITS) as run:
    print(run.run_id, flush=True)
    time.sleep(600)
"""


def test_a_run_whose_process_was_killed_is_closed_as_abandoned_by_the_next_pass(
    catalog: Catalog,
) -> None:
    from state_runtime.catalog import RunKind
    from state_runtime.maintenance.runs import recorded_run

    url = catalog.engine.url.render_as_string(hide_password=False)
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", DOOMED, url], cwd=repo, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        run_id = int(child.stdout.readline())
        running = catalog.run(run_id)
        assert running is not None and running.outcome == "running" and running.pid == child.pid
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    with recorded_run(catalog, RunKind.VALIDATE, "next", {}, DEFAULT_LIMITS) as run:
        assert run.run_id != run_id
    gone = catalog.run(run_id)
    assert gone is not None and gone.outcome == "abandoned" and gone.ended_at is not None
    assert f"its process {child.pid} on" in str(gone.error) and "is gone" in str(gone.error)
    latest = catalog.run(run.run_id)
    assert latest is not None and latest.outcome == "succeeded"
    # A silent run elsewhere (another host): abandoned once its heartbeat is old enough.
    other = catalog.start_run("snapshot", "elsewhere")
    later = datetime.now(UTC) + timedelta(minutes=6)
    assert [r.run_id for r in catalog.close_abandoned_runs(now=later)] == [other]
    assert catalog.close_abandoned_runs(now=later) == []  # once
