"""Faults: wrong URLs, servers that are down, transient errors, transactions that fail."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.tables import checkpoint_files, commit_log
from state_runtime.catalog.sql import commits
from state_runtime.errors import CatalogError, CatalogUnavailable, InvalidArgument
from state_runtime.identity import CheckpointRef, StoreId, parse_file_name
from tests.catalog.conftest import FAST_RETRY, PG_HOST, PG_PORT, PG_USER
from tests.catalog.factory import QUERY, ROOT, Stream, info

A, B = StoreId(0, 0), StoreId(0, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "not a valid SQLAlchemy URL"),
        ("mysql://user:sekret@db/state", "unsupported database 'mysql'"),
        ("postgresql+nodriver://postgres:sekret@localhost/x", "cannot be used"),
    ],
)
def test_wrong_url(url: str, message: str) -> None:
    with pytest.raises(CatalogUnavailable, match=message) as err:
        Catalog.open(url, retry=FAST_RETRY)
    assert "sekret" not in str(err.value)


def test_server_down_is_unavailable_after_bounded_retries() -> None:
    url = f"postgresql+psycopg2://postgres:sekret@127.0.0.1:{free_port()}/state"
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable) as err:
        Catalog.open(url, retry=FAST_RETRY)
    message = str(err.value)
    assert "cannot connect to the catalog" in message and "after 3 attempts" in message
    assert "Connection refused" in message or "could not connect" in message
    assert "sekret" not in message and "***" in message
    assert time.monotonic() - started < 5


@pytest.mark.postgres
def test_missing_database_is_unavailable(pg_database: str) -> None:
    url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/no_such_catalog_db"
    with pytest.raises(CatalogUnavailable, match='database "no_such_catalog_db" does not exist'):
        Catalog.open(url, retry=FAST_RETRY)


def test_sqlite_in_an_impossible_place(tmp_path: Path) -> None:
    """Only creating a catalog (upgrade) creates its folder, so that is where it fails."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(CatalogUnavailable, match="cannot create the folder"):
        Catalog.open(f"sqlite:///{blocker / 'catalog.db'}", upgrade=True, retry=FAST_RETRY)


class _SerializationFailure(Exception):
    pgcode = "40001"


def _fail_first(monkeypatch: pytest.MonkeyPatch, times: int, error: BaseException) -> list[int]:
    """Make the commit's write step raise ``error`` on its first ``times`` calls."""
    calls: list[int] = []
    real = commits._apply

    def flaky(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        result = real(*args, **kwargs)
        if len(calls) <= times:
            raise error
        return result

    monkeypatch.setattr(commits, "_apply", flaky)
    return calls


def test_transient_errors_are_retried(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = Stream(catalog, [A, B])
    error = sa.exc.OperationalError("COMMIT", {}, _SerializationFailure("could not serialize"))
    calls = _fail_first(monkeypatch, 2, error)
    infos = stream.commit()
    assert len(calls) == 3
    assert catalog.committed_ids(ROOT, QUERY, 0) == {i.store: i.ref for i in infos}


def test_retries_are_bounded(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = Stream(catalog, [A])
    error = sa.exc.OperationalError("COMMIT", {}, _SerializationFailure("could not serialize"))
    calls = _fail_first(monkeypatch, 99, error)
    with pytest.raises(CatalogError, match=r"failed after 3 attempts.*could not serialize"):
        stream.commit()
    assert len(calls) == 3
    assert catalog.committed_ids(ROOT, QUERY, 0) == {}


def test_a_failure_after_every_write_leaves_nothing(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit wrote its files, log entries and states, then failed: all rolled back."""
    stream = Stream(catalog, [A, B])
    stream.commit()
    _fail_first(monkeypatch, 1, RuntimeError("driver crashed mid-commit"))
    with pytest.raises(RuntimeError, match="mid-commit"):
        catalog.commit_batch(ROOT, QUERY, 1, [stream.delta(A), stream.delta(B)])
    with catalog.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(commit_log)).scalar() == 2
        files = connection.execute(sa.select(sa.func.count()).select_from(checkpoint_files))
        assert files.scalar() == 2
    assert catalog.latest_committed(ROOT)[A].version == 1


@pytest.mark.postgres
def test_a_connection_killed_mid_commit_is_retried(
    pg_catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real connection reset: the server terminates the backend inside the transaction."""
    stream = Stream(pg_catalog, [A, B])
    calls: list[int] = []
    real = commits._apply

    def killed_once(connection: sa.Connection, *args: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            connection.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        return real(connection, *args, **kwargs)

    monkeypatch.setattr(commits, "_apply", killed_once)
    infos = stream.commit()
    assert len(calls) == 2
    assert pg_catalog.committed_ids(ROOT, QUERY, 0) == {i.store: i.ref for i in infos}
    with pg_catalog.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(commit_log)).scalar() == 2


HUGE = 2**63  # one past BIGINT


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda c: c.commit_batch(ROOT, QUERY, HUGE, []), "invalid batch id"),
        (lambda c: c.run(HUGE), "invalid run id"),
        (lambda c: c.finish_run(HUGE, "failed"), "invalid run id"),
        (lambda c: c.recent_runs(limit=HUGE), "invalid limit"),
        (lambda c: c.record_files(ROOT, [info(A, HUGE, "a" * 32)]), "invalid version"),
        (lambda c: c.committed_ids(ROOT, QUERY, HUGE), "invalid batch id"),
        (lambda c: c.deletion_history(limit=2**64), "integer range"),
        (lambda c: c.commit_history(ROOT, limit=2**64), "integer range"),
    ],
)
def test_numbers_past_the_database_range_are_invalid_arguments(
    catalog: Catalog, call: Any, says: str
) -> None:
    """Ids, versions and limits beyond BIGINT: InvalidArgument, never OverflowError or a
    driver's error, whether the library checks them first or the database refuses them."""
    with pytest.raises(InvalidArgument, match=says):
        call(catalog)


def test_ids_past_the_catalog_columns_are_refused_where_they_enter() -> None:
    with pytest.raises(InvalidArgument, match="operator id 2147483648"):
        StoreId(2**31, 0)
    assert StoreId(2**31 - 1, 2**31 - 1).partition_id == 2**31 - 1
    with pytest.raises(InvalidArgument, match="version"):
        CheckpointRef(HUGE, "a" * 32)
    assert parse_file_name(f"{HUGE}_{'a' * 32}.delta") is None  # a stray, never a checkpoint
    assert parse_file_name(f"{HUGE - 1}_{'a' * 32}.delta") is not None
