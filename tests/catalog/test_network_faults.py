"""Database faults through a real TCP proxy in front of the real PostgreSQL server.

Every catalog call must end within its bounded time (CatalogTimeouts), then raise a typed,
retryable error; retried after a reset or a lost COMMIT answer it must take effect exactly
once. ``tests/pg_proxy.py`` makes the faults: a network that stops passing packets, a reset
at the n-th statement, a COMMIT whose answer never comes back.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import (
    BatchMetrics,
    Catalog,
    CatalogTimeouts,
    NewLayout,
    OperatorRegistration,
    RetentionPolicy,
    RetryPolicy,
    StoreKey,
)
from state_runtime.catalog.schema.tables import (
    batch_intents,
    batch_metrics,
    checkpoint_files,
    commit_log,
    deletion_ledger,
    maintenance_runs,
    operator_layouts,
    store_leases,
    stores,
)
from state_runtime.errors import (
    CatalogMisconfigured,
    CatalogTimeout,
    CatalogUnavailable,
)
from state_runtime.identity import StoreId
from state_runtime.store.schema_history import SchemaEntry, SchemaHistory
from state_runtime.store.state_schema import StateSchema
from tests.catalog.conftest import PG_HOST, PG_PORT
from tests.catalog.factory import QUERY, ROOT, Stream
from tests.pg_proxy import PgFaultProxy

pytestmark = pytest.mark.postgres

A, B = StoreId(0, 0), StoreId(0, 1)
SECOND = timedelta(seconds=1)
# Short bounds so that a test of silence is quick: one attempt may take 1s. Only the catalog
# meant to be cut has them (``cut``): under load a healthy statement through the proxy may
# take that long, and a cut would add attempts the tests count.
TIMEOUTS = CatalogTimeouts(
    connect=2 * SECOND, statement=SECOND, lock=SECOND, attempt=SECOND, pool=SECOND, keepalive=SECOND
)
RETRY = RetryPolicy(attempts=3, initial_delay_s=0.05, max_delay_s=0.2)
SLACK = 10.0
"""Seconds a wall-clock bound allows beyond what the timeouts and retry policy add up to: a
loaded machine (CI runs two workers on two cores) is slow, never fast."""


def bound(timeouts: CatalogTimeouts, *parts: str) -> float:
    """The longest a call may take under ``timeouts``: each of RETRY's attempts waits at most
    the sum of ``parts`` (e.g. ``attempt``, ``connect``), plus the retry delays and SLACK."""
    attempt = sum(getattr(timeouts, part).total_seconds() for part in parts)
    return RETRY.attempts * (attempt + RETRY.max_delay_s) + SLACK


@pytest.fixture
def proxy(pg_database: str) -> Iterator[PgFaultProxy]:
    with PgFaultProxy(PG_HOST, PG_PORT) as running:
        yield running


@pytest.fixture
def faulty(pg_catalog: Catalog, proxy: PgFaultProxy, pg_database: str) -> Iterator[Catalog]:
    """The (emptied) test catalog, reached through the proxy with the default timeouts;
    ``pg_catalog`` reaches it directly, to check what really happened."""
    catalog = Catalog.open(proxy.url(pg_database), retry=RETRY)
    yield catalog
    catalog.close()


@pytest.fixture
def cut(faulty: Catalog, proxy: PgFaultProxy, pg_database: str) -> Iterator[Catalog]:
    """The same catalog through the proxy with TIMEOUTS: the one whose calls meet the faults."""
    catalog = Catalog.open(proxy.url(pg_database), retry=RETRY, timeouts=TIMEOUTS)
    yield catalog
    catalog.close()


@contextmanager
def through(stream: Stream, catalog: Catalog) -> Iterator[Stream]:
    """``stream``, its calls made through ``catalog`` for the block."""
    healthy, stream.catalog = stream.catalog, catalog
    try:
        yield stream
    finally:
        stream.catalog = healthy


def count(catalog: Catalog, table: sa.Table) -> int:
    with catalog.engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_a_silent_network_ends_the_call_in_bounded_time_and_the_retry_succeeds(
    cut: Catalog,
    proxy: PgFaultProxy,
    pg_catalog: Catalog,
    pg_database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The retry is made on a catalog whose pooled connection died in the silence unnoticed:
    its first attempt is cut at the attempt timeout (5s here; the default, 60s, made the
    test a minute long) and the call succeeds on a new connection."""
    idle = Catalog.open(
        proxy.url(pg_database),
        retry=RETRY,
        timeouts=dataclasses.replace(TIMEOUTS, attempt=5 * SECOND),
    )
    stream = Stream(idle, [A, B])
    stream.commit()
    infos = [stream.delta(A), stream.delta(B)]
    proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable) as err:
        cut.commit_batch(ROOT, QUERY, 1, infos)
    elapsed = time.monotonic() - started
    # Attempt 1 is cut by the watchdog (1s), attempts 2 and 3 cannot connect (2s each).
    assert 1.0 <= elapsed < bound(TIMEOUTS, "attempt", "connect"), elapsed
    assert err.value.retryable
    assert "after 3 attempts" in str(err.value)
    assert pg_catalog.committed_ids(ROOT, QUERY, 1) == {}

    proxy.heal()
    with idle:
        idle.commit_batch(ROOT, QUERY, 1, infos)  # the documented retry
    assert "no answer within 5s (attempt timeout); the connection was cut" in caplog.text
    assert pg_catalog.committed_ids(ROOT, QUERY, 1) == {i.store: i.ref for i in infos}
    assert count(pg_catalog, commit_log) == 4


def _statements_of(proxy: PgFaultProxy, call: Callable[[], object]) -> list[str]:
    before = len(proxy.statements)
    call()
    return proxy.statements[before:]


def _kill_sessions_idle_in_transaction(catalog: Catalog) -> int:
    with catalog.engine.begin() as connection:
        return len(
            connection.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
                " current_database() AND state = 'idle in transaction' AND pid <>"
                " pg_backend_pid()"
            ).all()
        )


def test_a_dead_connection_holding_store_locks_does_not_block_the_retry(
    faulty: Catalog, cut: Catalog, proxy: PgFaultProxy, pg_catalog: Catalog, pg_database: str
) -> None:
    """The connection dies right after locking the stores. The server ends the session idle
    in its transaction after the attempt timeout, freeing the locks, and the retried call
    commits; without that server-side timeout the locks stay held and the call fails."""
    stream = Stream(faulty, [A, B])
    stream.commit()  # creates the stores: later commits only lock them
    statements = _statements_of(proxy, stream.commit)
    locking = next(i for i, text in enumerate(statements) if "FOR UPDATE" in text)

    never = Catalog.open(
        proxy.url(pg_database) + "&options=-cidle_in_transaction_session_timeout%3D0",
        retry=RETRY,
        timeouts=dataclasses.replace(TIMEOUTS, statement=2 * SECOND, attempt=3 * SECOND),
    )
    try:
        never.clock.sync()  # its one read of the database clock, before statements are counted
        proxy.blackhole_at(locking + 2)  # the statement after the lock is never delivered
        with pytest.raises(CatalogTimeout, match="lock timeout"):
            Stream(never, [A, B], batch=stream.batch, committed=stream.committed).commit()
    finally:
        never.close()
    assert _kill_sessions_idle_in_transaction(pg_catalog) == 1

    cut.clock.sync()  # before statements are counted, as above
    proxy.blackhole_at(locking + 2)
    started = time.monotonic()
    with through(stream, cut):
        infos = stream.commit()
    assert time.monotonic() - started < bound(TIMEOUTS, "attempt", "connect")
    assert pg_catalog.committed_ids(ROOT, QUERY, stream.batch - 1) == {
        i.store: i.ref for i in infos
    }
    assert _kill_sessions_idle_in_transaction(pg_catalog) == 0


def test_a_reset_at_any_statement_of_a_commit_is_retried_to_exactly_one_commit(
    faulty: Catalog, proxy: PgFaultProxy, pg_catalog: Catalog
) -> None:
    stream = Stream(faulty, [A, B], writers_behind=None)  # only the commit's own statements
    statements = _statements_of(proxy, stream.commit)
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT"
    for n in range(1, len(statements) + 1):
        proxy.reset_at(n)
        infos = stream.commit()
        proxy.clear()
        assert pg_catalog.committed_ids(ROOT, QUERY, stream.batch - 1) == {
            i.store: i.ref for i in infos
        }, f"reset at statement {n} ({statements[n - 1]!r})"
    assert count(pg_catalog, commit_log) == 2 * stream.batch
    assert pg_catalog.latest_committed(ROOT)[A].version == stream.batch


@dataclass
class LostAnswer:
    """A catalog call whose COMMIT answer is lost once, and what must hold afterwards."""

    name: str
    prepare: Callable[[Catalog, Stream], Any]
    call: Callable[[Catalog, Stream, Any], Any]
    check: Callable[[Catalog, Stream, Any, Any], None]


KEY = StoreKey(ROOT, A)
TTL = timedelta(minutes=5)
METRICS = BatchMetrics(7, 2, 2, 10, 1.0, 1, 0)


def _run_and_lease(catalog: Catalog, stream: Stream) -> tuple[int, Any]:
    run = catalog.start_run("cleanup", "holder")
    return run, catalog.try_acquire_lease(KEY, "holder", TTL, run_id=run)


def _check_one_run(catalog: Catalog, _s: Stream, _p: Any, run_id: int) -> None:
    assert count(catalog, maintenance_runs) == 1
    _check_one_run_of(catalog, run_id)


def _check_finished(catalog: Catalog, _s: Stream, run_id: int, _r: Any) -> None:
    run = catalog.run(run_id)
    assert run is not None and run.outcome == "succeeded" and run.counts == {"n": 1}


def _check_lease_taken(catalog: Catalog, _s: Stream, _p: Any, lease: Any) -> None:
    assert lease is not None and lease.owner == "me"
    assert catalog.try_acquire_lease(KEY, "other", TTL) is None
    assert catalog.release_lease(lease)


def _check_released(catalog: Catalog, _s: Stream, _p: Any, released: bool) -> None:
    assert released is True
    assert count(catalog, store_leases) == 0
    assert catalog.try_acquire_lease(KEY, "other", TTL) is not None


def _check_renewed(catalog: Catalog, _s: Stream, prepared: Any, renewed: Any) -> None:
    _, lease = prepared
    assert renewed.expires_at > lease.expires_at
    assert catalog.try_acquire_lease(KEY, "other", TTL) is None


def _check_committed(catalog: Catalog, _s: Stream, infos: Any, _r: Any) -> None:
    assert catalog.committed_ids(ROOT, QUERY, 1) == {i.store: i.ref for i in infos}
    assert count(catalog, commit_log) == 4
    assert catalog.latest_committed(ROOT)[A].version == 2


def _check_recorded(catalog: Catalog, _s: Stream, infos: Any, _r: Any) -> None:
    assert count(catalog, checkpoint_files) == 2 + len(infos)


def _claim(catalog: Catalog, stream: Stream) -> int:
    """Versions 1 to 4 and snapshots of 3: the deltas of 1 to 3 are deletable."""
    stream.run(3)
    for store in stream.stores:
        stream.snapshot(store, 3)
    return catalog.start_run("cleanup", "cleaner")


def _check_claimed(catalog: Catalog, _s: Stream, run_id: int, claimed: Any) -> None:
    """Claimed once: a retry after a lost answer returns none of what the lost attempt
    claimed (the run claims a file once), and the next run resumes every one of them."""
    assert not catalog.claim_deletions(run_id, RetentionPolicy(window=SECOND), ROOT)
    later = catalog.start_run("cleanup", "next")
    again = catalog.claim_deletions(later, RetentionPolicy(window=SECOND), ROOT)
    assert {v.file.path for v in claimed} <= {v.file.path for v in again}
    assert len(again) == 2 * 3  # the deltas of versions 1 to 3: the snapshot replaces them


def _prepare_deletions(catalog: Catalog, stream: Stream) -> tuple[int, list[str]]:
    run = _claim(catalog, stream)
    claimed = catalog.claim_deletions(run, RetentionPolicy(window=SECOND), ROOT)
    return run, [v.file.path for v in claimed]


def _check_deleted(catalog: Catalog, _s: Stream, prepared: Any, recorded: int) -> None:
    assert count(catalog, deletion_ledger) == len(prepared[1])
    assert catalog.record_deletions(prepared[0], ROOT, prepared[1]) == 0


def _check_metrics(catalog: Catalog, _s: Stream, _p: Any, _r: Any) -> None:
    assert count(catalog, batch_metrics) == 1
    (recorded,) = catalog.batch_metrics(ROOT, QUERY)
    assert recorded.metrics.rows_in == 7


def _check_registered(catalog: Catalog, _s: Stream, _p: Any, _r: Any) -> None:
    assert count(catalog, stores) == 3
    record = next(r for r in catalog.stores(ROOT) if r.key.store == StoreId(9, 0))
    assert record.key_schema == "k string"


NEW_OPERATOR = OperatorRegistration(
    9,
    "default",
    [StoreId(9, 0), StoreId(9, 1)],
    "k string",
    "v long",
    NewLayout(9, "default", 2, [{"by": "hash"}]),
    SchemaHistory((SchemaEntry.make(StateSchema.of("k string", "v long")),)),
)


def _check_query_registered(catalog: Catalog, _s: Stream, _p: Any, _r: Any) -> None:
    """The operator's stores, first layout and schema history each recorded once."""
    assert count(catalog, stores) == 4
    assert catalog.layouts(ROOT)[9, "default"].num_partitions == 2
    assert count(catalog, operator_layouts) == 1
    assert catalog.schema_histories(ROOT)[9, "default"] == NEW_OPERATOR.history


def _old_run(catalog: Catalog, _stream: Stream) -> int:
    run = catalog.start_run("validate", "crashed")
    with catalog.engine.begin() as connection:  # its process died long ago
        connection.execute(
            sa.update(maintenance_runs)
            .where(maintenance_runs.c.run_id == run)
            .values(heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"), pid=None)
        )
    return run


def _check_abandoned(catalog: Catalog, _s: Stream, run_id: int, closed: Any) -> None:
    run = catalog.run(run_id)
    assert run is not None and run.outcome == "abandoned" and "no heartbeat" in str(run.error)


def _check_begun(catalog: Catalog, _s: Stream, old_run: int, started: Any) -> None:
    """One transaction did it all, once: the dead run closed, one new run, its lease held
    (by the retry too: the lease's token is the call's)."""
    _check_abandoned(catalog, _s, old_run, None)
    assert count(catalog, maintenance_runs) == 2
    _check_one_run_of(catalog, started.run_id)
    (lease,) = started.leases
    assert lease is not None and lease.run_id == started.run_id
    _check_lease_taken(catalog, _s, None, lease)


def _check_one_run_of(catalog: Catalog, run_id: int) -> None:
    run = catalog.run(run_id)
    assert run is not None and run.outcome == "running" and run.pid is not None


def _check_finished_and_released(catalog: Catalog, _s: Stream, prepared: Any, _r: Any) -> None:
    _check_finished(catalog, _s, prepared[0], None)
    _check_released(catalog, _s, None, True)


def _check_begun_batch(catalog: Catalog, _s: Stream, _p: Any, start: Any) -> None:
    """The intent recorded once (a retry's insert finds its run's row and adds nothing),
    and the retry read what the batch starts from."""
    assert count(catalog, batch_intents) == 1
    assert start.last_batch == 0 and set(start.previous) == {A, B}


LOST_ANSWERS = [
    LostAnswer(
        "begin_batch",
        lambda c, s: None,
        lambda c, s, p: c.begin_batch(ROOT, QUERY, 1, "run1", [(0, "default", 2)]),
        _check_begun_batch,
    ),
    LostAnswer(
        "begin_run",
        _old_run,
        lambda c, s, p: c.begin_run("cleanup", "me", {"x": 1}, leases=[KEY], ttl=TTL),
        _check_begun,
    ),
    LostAnswer(
        "finish_run_releasing_leases",
        _run_and_lease,
        lambda c, s, p: c.finish_run(p[0], "succeeded", {"n": 1}, release=[p[1]]),
        _check_finished_and_released,
    ),
    LostAnswer(
        "start_run",
        lambda c, s: None,
        lambda c, s, p: c.start_run("cleanup", "me", {"x": 1}),
        _check_one_run,
    ),
    LostAnswer(
        "finish_run",
        lambda c, s: c.start_run("cleanup", "me"),
        lambda c, s, run: c.finish_run(run, "succeeded", {"n": 1}),
        _check_finished,
    ),
    LostAnswer(
        "try_acquire_lease",
        lambda c, s: None,
        lambda c, s, p: c.try_acquire_lease(KEY, "me", TTL),
        _check_lease_taken,
    ),
    LostAnswer(
        "release_lease",
        _run_and_lease,
        lambda c, s, p: c.release_lease(p[1]),
        _check_released,
    ),
    LostAnswer(
        "renew_lease",
        _run_and_lease,
        lambda c, s, p: c.renew_lease(p[1], TTL * 2),
        _check_renewed,
    ),
    LostAnswer(
        "commit_batch",
        lambda c, s: [s.delta(A), s.delta(B)],
        lambda c, s, infos: s.commit(infos),
        _check_committed,
    ),
    LostAnswer(
        "record_files",
        lambda c, s: [s.delta(A), s.delta(B)],
        lambda c, s, infos: c.record_files(ROOT, infos),
        _check_recorded,
    ),
    LostAnswer(
        "claim_deletions",
        _claim,
        lambda c, s, run: c.claim_deletions(run, RetentionPolicy(window=SECOND), ROOT),
        _check_claimed,
    ),
    LostAnswer(
        "record_deletions",
        _prepare_deletions,
        lambda c, s, p: c.record_deletions(p[0], ROOT, p[1]),
        _check_deleted,
    ),
    LostAnswer(
        "record_batch_metrics",
        lambda c, s: None,
        lambda c, s, p: c.record_batch_metrics(ROOT, QUERY, 0, METRICS),
        _check_metrics,
    ),
    LostAnswer(
        "register_store",
        lambda c, s: None,
        lambda c, s, p: c.register_store(ROOT, StoreId(9, 0), "k string", "v long"),
        _check_registered,
    ),
    LostAnswer(
        "register_query",
        lambda c, s: None,
        lambda c, s, p: c.register_query(ROOT, QUERY, 0, [NEW_OPERATOR]),
        _check_query_registered,
    ),
    LostAnswer(
        "close_abandoned_runs",
        _old_run,
        lambda c, s, p: c.close_abandoned_runs(),
        _check_abandoned,
    ),
]


@pytest.mark.parametrize("case", LOST_ANSWERS, ids=lambda c: c.name)
def test_a_lost_commit_answer_is_retried_with_the_effect_of_one_call(
    case: LostAnswer, faulty: Catalog, cut: Catalog, proxy: PgFaultProxy, pg_catalog: Catalog
) -> None:
    stream = Stream(faulty, [A, B])
    stream.commit()
    prepared = case.prepare(faulty, stream)
    cut.clock.sync()  # its one read of the database clock, before the answer is swallowed
    commits_before = proxy.statements.count("COMMIT")
    proxy.swallow_commit_answers(1)
    with through(stream, cut):
        result = case.call(cut, stream, prepared)
    # The first COMMIT reached the server and committed; its answer was lost; the call was
    # retried on a new connection and found its own work done.
    assert proxy.statements.count("COMMIT") >= commits_before + 2
    case.check(pg_catalog, stream, prepared, result)


def test_a_run_finished_through_a_clock_reading_behind_its_start_ends_when_it_started(
    pg_catalog: Catalog, proxy: PgFaultProxy, pg_database: str
) -> None:
    """Two readings of the database's clock disagree by up to half a round trip: one taken
    through slow answers runs behind. A run started through one reading and finished through
    one behind it is recorded as ending when it started, not refused by the runs' order
    check (a CI run failed so by 0.45 ms: the run started by one catalog, finished by another)."""
    proxy.delay_answer_to("clock_timestamp()", 0.4)
    behind = Catalog.open(proxy.url(pg_database), retry=RETRY)
    try:
        behind.clock.sync()  # the database read its clock ~0.4 s before this host heard it
        run = pg_catalog.start_run("cleanup", "me")
        assert behind.now() < pg_catalog.run(run).started_at  # type: ignore[union-attr]
        behind.finish_run(run, "succeeded", {"n": 1})
    finally:
        behind.close()
    _check_finished(pg_catalog, Stream(pg_catalog, [A]), run, None)
    finished = pg_catalog.run(run)
    assert finished is not None and finished.ended_at == finished.started_at


def test_a_missing_database_is_refused_at_once(proxy: PgFaultProxy) -> None:
    started = time.monotonic()
    with pytest.raises(CatalogMisconfigured, match="no_such_catalog_db") as err:
        Catalog.open(proxy.url("no_such_catalog_db"), retry=RETRY)
    assert isinstance(err.value, CatalogUnavailable) and not err.value.retryable
    assert proxy.connections == 1  # not retried as transient
    assert time.monotonic() - started < CatalogTimeouts().connect.total_seconds() + SLACK


def test_an_exhausted_pool_is_unavailable_in_bounded_time(cut: Catalog) -> None:
    pool = cut.engine.pool
    held = [cut.engine.connect() for _ in range(pool.size() + 10)]  # pool + overflow
    try:
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable, match="no free connection") as err:
            cut.stores()
        assert err.value.retryable
        assert time.monotonic() - started < bound(TIMEOUTS, "pool")
    finally:
        for connection in held:
            connection.close()
    assert cut.stores() == []


def test_a_locked_sqlite_catalog_times_out_then_works(tmp_path: Path) -> None:
    """Another process's writer holds the database lock: bounded by the lock timeout."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = Catalog.open(url, upgrade=True, retry=RETRY, timeouts=TIMEOUTS)
    blocker = sqlite3.connect(tmp_path / "catalog.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    released = threading.Timer(60, blocker.rollback)  # only if the lock timeout failed
    released.start()
    try:
        started = time.monotonic()
        with pytest.raises(CatalogTimeout, match="database is locked") as err:
            Stream(catalog, [A]).commit()
        assert err.value.retryable and time.monotonic() - started < bound(TIMEOUTS, "lock")
    finally:
        released.cancel()
        blocker.rollback()
        blocker.close()
    Stream(catalog, [A]).commit()
    assert catalog.latest_committed(ROOT)[A].version == 1
    catalog.close()


def test_silence_during_the_first_queries_of_a_new_connection_is_cut(
    proxy: PgFaultProxy, pg_database: str, pg_catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLAlchemy's own first queries on a new engine's connection are under the attempt's
    deadline too: the connection dies at the first statement, the open still succeeds. The
    attempt timeout is longer than TIMEOUTS' so that the healthy queries of the connection
    asked next are not cut as well on a loaded machine: the proxy counts the connections."""
    timeouts = dataclasses.replace(TIMEOUTS, attempt=5 * SECOND)
    proxy.blackhole_at(1)
    started = time.monotonic()
    with Catalog.open(proxy.url(pg_database), retry=RETRY, timeouts=timeouts) as catalog:
        assert catalog.stores() == []
    assert 5.0 <= time.monotonic() - started < bound(timeouts, "attempt", "connect")
    assert "no answer within 5s (attempt timeout); the connection was cut" in caplog.text
    assert proxy.connections == 2  # cut once, asked again on a new connection
