"""Every catalog engine of a process compiles into one cache (statement_cache.py): a catalog
opened later runs the statements an earlier one compiled without compiling them again; the
hot statements are built once."""

from __future__ import annotations

import functools
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection.statement_cache import COMPILED
from state_runtime.catalog.records import StoreKey
from state_runtime.catalog.schema.reading_views import READER_VIEWS
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.catalog.sql import batch_intents, commits, layouts, lookups
from state_runtime.identity import StoreId
from state_runtime.retention import RetentionPolicy
from tests.catalog.factory import Stream
from tests.statements import statements as sent_by_engine


def test_a_catalog_opened_later_compiles_nothing_an_earlier_one_compiled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with Catalog.open(url, upgrade=True) as first:
        assert first.roots() == []
    assert len(COMPILED) > 0
    with Catalog.open(url) as second:
        hits: list[bool] = []

        @event.listens_for(second.engine, "after_cursor_execute")
        def seen(*args: Any) -> None:
            context = args[4]
            if context.compiled is not None:
                hits.append(context.cache_hit == context.dialect.CACHE_HIT)

        assert second.roots() == []
    assert hits and all(hits), hits


def test_the_hot_lookups_run_statements_built_once(catalog: Catalog) -> None:
    """The lookups a batch's start and commit, a file record and a maintenance run make
    (committed ids, the last batch, the last restore, files by path, a store's last run, the
    layouts) run the same statement objects
    call after call, so SQLAlchemy keeps each one's cache key instead of building the
    statement and its key again; and they still answer each call's own values."""
    stream = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)])
    stream.commit()
    stream.commit()
    with catalog.engine.connect() as connection:
        found = lookups.store_ids(connection, READER_VIEWS, stream.root, stream.stores)
    store_ids = sorted(found.values())
    run_id = catalog.start_run("snapshot", "tests")
    statements: list[list[int]] = []

    def calls(connection: Connection, version: int) -> tuple[object, ...]:
        f = checkpoint_files.c
        path = stream.committed[StoreId(0, 0)][version - 1].path
        wanted = {(store_ids[0], version, path)}
        lookups.mark_maintained(connection, store_ids, run_id)
        return (
            lookups.committed_ids_at(connection, [(store_ids[0], version)]),
            [row[0] for row in lookups.rows_at(connection, wanted, (f.file_id,))],
            layouts.layout_history(connection, READER_VIEWS, stream.root),
            commits.committed_ids(connection, READER_VIEWS, stream.root, stream.query, version - 1),
            commits.latest_entry(connection, READER_VIEWS, stream.root, stream.query),
            batch_intents.restored_to(connection, stream.root, stream.query),
        )

    answers = []
    for version in (1, 2):
        ran: list[int] = []
        listener = functools.partial(lambda seen, *args: seen.append(id(args[1])), ran)
        event.listen(catalog.engine, "before_execute", listener)
        with catalog.engine.connect() as connection, connection.begin() as transaction:
            answers.append(calls(connection, version))
            transaction.rollback()
        event.remove(catalog.engine, "before_execute", listener)
        statements.append(ran)
    assert statements[0] == statements[1] and len(statements[0]) == 7
    one, two = answers
    assert one[0] != two[0] and one[1] != two[1] and one[3] != two[3]
    assert one[3] == {s: stream.committed[s][0].ref for s in stream.stores}


def test_the_store_questions_keep_their_prepared_statements(tmp_path: Path) -> None:
    """SQLite prepares a statement again at every new binding when a bound value was compared
    with a partial index's constant (a file's state, kind or verification): the conditions
    those indexes read are written into the SQL, so health, the retained versions and the
    file verdicts, asked again, run the statements SQLite prepared the first time
    (``sqlite_stmt``: each prepared statement of the connection and its re-prepare count)."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with Catalog.open(url, upgrade=True, connections=1) as catalog:
        stream = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)])
        for _ in range(3):
            stream.commit()
        policy = RetentionPolicy()
        for _ in range(3):
            list(catalog.health_pages(policy, root=stream.root, now=catalog.now()))
            catalog.retained_versions_of(stream.root, stream.stores)
            catalog.file_verdicts(policy, root=stream.root, now=catalog.now())
        prepared = catalog._read(
            "prepared statements",
            lambda c, v: c.exec_driver_sql("SELECT sql, reprep, run FROM sqlite_stmt").all(),
        )
    reads = [(sql, reprep) for sql, reprep, run in prepared if "read_checkpoint_files" in sql]
    assert len(reads) >= 3, prepared
    assert all(reprep == 0 for _, reprep in reads), [r for r in reads if r[1]]


def test_a_sqlite_transaction_holds_the_lock_from_its_start_with_no_engine_events(
    tmp_path: Path,
) -> None:
    """``BEGIN IMMEDIATE`` is the SQLite dialect's own begin, not a ``begin`` event's
    statement: the engine has no connection events to dispatch at every statement, and a
    transaction still holds the database's write lock from its start."""
    path = tmp_path / "catalog.db"
    with Catalog.open(f"sqlite:///{path}", upgrade=True) as catalog:
        assert not catalog.engine.dispatch.begin and not catalog.engine.dispatch.before_execute
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            with (
                catalog.engine.connect() as connection,
                connection.begin(),
                pytest.raises(sqlite3.OperationalError, match="locked"),
            ):
                other.execute("BEGIN IMMEDIATE")
            other.execute("BEGIN IMMEDIATE")
            other.rollback()
        finally:
            other.close()


def test_a_maintenance_runs_statements_are_built_once(catalog: Catalog) -> None:
    """A maintenance run's start with the sweep of abandoned runs and its leases (taken by one
    upsert), and its finish giving them back, run the same 7 statement objects run after run
    (the start's insert returns its run: no read of it by token); each run still takes, and
    gives back, its own leases."""
    stream = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)])
    stream.commit()
    keys = [StoreKey(stream.root, store) for store in stream.stores]
    statements: list[list[Any]] = []
    for _ in range(2):
        ran: list[Any] = []  # the statements themselves: ids of freed ones could be reused
        listener = functools.partial(lambda seen, *args: seen.append(args[1]), ran)
        event.listen(catalog.engine, "before_execute", listener)
        started = catalog.begin_run("snapshot", "tests", leases=keys, ttl=timedelta(minutes=1))
        run_id, leases = started.run_id, started.leases
        assert started.abandoned == []
        assert all(lease is not None and lease.run_id == run_id for lease in leases)
        held = [lease for lease in leases if lease is not None]
        catalog.finish_run(run_id, "succeeded", {}, status_limits=None, release=held)
        event.remove(catalog.engine, "before_execute", listener)
        statements.append(ran)
        run = catalog.run(run_id)
        assert run is not None and run.outcome == "succeeded"
    assert len(statements[0]) == len(statements[1]) == 7, statements
    assert all(a is b for a, b in zip(*statements, strict=True)), statements


def test_the_hot_lookups_send_one_text_on_postgresql_whatever_their_lists(
    catalog: Catalog,
) -> None:
    """On PostgreSQL the lookups a commit and a maintenance run make by lists (store ids,
    committed ids, files by path, ``last_run_id``) pass each list as one array parameter: a
    list of one and one of three send the same statement texts (SQLite: IN lists)."""
    stream = Stream(catalog, [StoreId(0, p) for p in range(3)])
    stream.commit()
    run_id = catalog.start_run("snapshot", "tests")
    texts: list[list[str]] = []
    for stores in (stream.stores[:1], stream.stores):
        with catalog.engine.connect() as connection, sent_by_engine(catalog.engine) as sent:
            found = lookups.store_ids(connection, READER_VIEWS, stream.root, stores)
            ids = sorted(found.values())
            assert len(ids) == len(stores)
            lookups.committed_ids_at(connection, [(i, 1) for i in ids])
            files = {(found[s], 1, stream.committed[s][0].path) for s in stores}
            assert len(lookups.rows_at(connection, files, (checkpoint_files.c.file_id,))) == len(
                stores
            )
            lookups.mark_maintained(connection, ids, run_id)
            connection.rollback()
        texts.append([text for text in sent if not text.startswith("BEGIN")])
    assert len(texts[0]) == 4
    assert (texts[0] == texts[1]) == (catalog.engine.dialect.name == "postgresql")
