"""The operators' views are rendered from the rules and recreated by every upgrade: a database
ends an upgrade with exactly the rendered views and functions, whatever an older version left
under those names; and on generated fleets the status the views give is the Python rule's."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime.catalog import Catalog, FoundProblem, RetentionPolicy, StoreKey
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema import operator_views as views
from state_runtime.catalog.schema.revision import (
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)
from state_runtime.identity import StoreId
from state_runtime.status import DEFAULT_LIMITS, store_status
from tests.catalog.factory import Stream, info


def present(connection: sa.Connection) -> dict[str, str]:
    """Every view and function in the catalog's schema: name -> its SQL (SQLite: the CREATE
    statement; PostgreSQL: a function's body, a view's definition). Trigger functions are
    the tables' (``root_queries``' in migration 0021, the grants' guard), not rendered."""
    if connection.dialect.name == "sqlite":
        rows = connection.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'view'")
        return {name: sql for name, sql in rows}
    functions = connection.exec_driver_sql(
        "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
        " AND prorettype <> 'trigger'::regtype"
    )
    found = {name: body for name, body in functions}
    viewdefs = connection.exec_driver_sql(
        "SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema()"
    )
    return found | {name: definition for name, definition in viewdefs}


def rendered_bodies(dialect: str) -> dict[str, str]:
    """What each rendered object should hold, as :func:`present` reads it back (PostgreSQL
    keeps a function's body verbatim; a view's definition is its own normal form)."""
    bodies = {}
    for derived in views.rendered(dialect):
        create = derived.statements[0]
        if dialect == "sqlite":
            bodies[derived.name] = create.strip()
        elif derived.kind == "FUNCTION":
            bodies[derived.name] = create.split("$$")[1]
    return bodies


def downgrade(connection: sa.Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


def assert_exactly_rendered(url: str) -> None:
    engine = create_catalog_engine(url)
    with engine.connect() as connection:
        found = present(connection)
    engine.dispose()
    dialect = engine.dialect.name
    assert set(found) == {d.name for d in views.rendered(dialect)}
    for name, body in rendered_bodies(dialect).items():
        assert found[name].strip() == body.strip(), name


def test_an_upgrade_leaves_exactly_the_rendered_views(empty_url: str) -> None:
    upgrade(create_catalog_engine(empty_url))
    assert_exactly_rendered(empty_url)


def test_migrations_hold_no_view_sql() -> None:
    """Only the renderer creates views: no migration carries CREATE VIEW or CREATE FUNCTION,
    but for a trigger's function (part of its table: ``root_queries``' in 0021)."""
    migrations = Path(views.__file__).with_name("migrations") / "versions"
    for path in migrations.glob("*.py"):
        text = path.read_text().upper()
        functions = text.count("CREATE FUNCTION")
        assert "CREATE VIEW" not in text, path.name
        assert functions == text.count("RETURNS TRIGGER"), path.name


def test_an_old_database_upgrades_to_exactly_the_rendered_views(empty_url: str) -> None:
    """A catalog whose views an older version wrote by hand (same names, other definitions,
    some of the other kind or signature), with data in it: the upgrade replaces every one of
    them with the rendered views and keeps every row. Then from an intermediate revision
    (which has no views at all) to head, the same."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    catalog = Catalog.open(empty_url)
    Stream(catalog, [StoreId(0, 0)], root="/old").run(3)
    catalog.close()
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as connection:
        views.drop(connection)
        for derived in views.rendered(engine.dialect.name):
            if postgres and derived.kind == "VIEW":  # once a function, hard-coding 20 and 100
                connection.exec_driver_sql(
                    f"CREATE FUNCTION {derived.name}(integer) RETURNS integer"
                    " LANGUAGE sql AS 'SELECT 20 + 100'"
                )
            elif postgres:
                connection.exec_driver_sql(f"CREATE VIEW {derived.name} AS SELECT 20 AS lag_warn")
            else:
                connection.exec_driver_sql(
                    f"CREATE VIEW {derived.name} AS SELECT 20 AS lag_warn, 100 AS orphan_warn"
                )
        before = connection.exec_driver_sql("SELECT count(*) FROM checkpoint_files").scalar_one()
    upgrade(engine)
    assert_exactly_rendered(empty_url)
    with engine.begin() as connection:
        after = connection.exec_driver_sql("SELECT count(*) FROM checkpoint_files").scalar_one()
        assert after == before == 3
        downgrade(connection, "0007_views_everywhere")
        assert present(connection) == {}
    upgrade(engine)
    assert_exactly_rendered(empty_url)
    with engine.connect() as connection:
        (row,) = connection.exec_driver_sql("SELECT status FROM state_store_health").all()
    assert row[0] == "unknown"
    engine.dispose()


def test_a_downgrade_drops_the_views_and_the_upgrade_brings_them_back(empty_url: str) -> None:
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    with engine.begin() as connection:
        downgrade(connection, "0005_run_ownership")
        assert present(connection) == {}
    upgrade(engine)
    engine.dispose()
    assert_exactly_rendered(empty_url)


def schema_version(url: str) -> int:
    """SQLite's schema cookie: every DDL statement (a view dropped or created) moves it."""
    engine = create_catalog_engine(url)
    with engine.connect() as connection:
        found = int(connection.exec_driver_sql("PRAGMA schema_version").scalar_one())
    engine.dispose()
    return found


def test_a_sqlite_catalog_at_head_is_opened_without_an_upgrade(tmp_path: Path) -> None:
    """At head with exactly the rendered views, the job's open (``upgrade="sqlite"``) and an
    explicit upgrade leave the schema untouched: no view dropped and created again."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    Catalog.open(url, upgrade="sqlite").close()
    before = schema_version(url)
    Catalog.open(url, upgrade="sqlite").close()
    upgrade(create_catalog_engine(url))
    assert schema_version(url) == before
    assert_exactly_rendered(url)


def test_a_catalog_opened_by_another_process_is_not_upgraded_again(tmp_path: Path) -> None:
    """Each process renders the same views whatever its hash seed (a rule's facts are a set),
    so a catalog another process created at head is opened without an upgrade."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    code = (
        "import sys\n"
        "from state_runtime.catalog import Catalog\n"
        "Catalog.open(sys.argv[1], upgrade='sqlite').close()\n"
    )
    versions = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", code, url], check=True, env=env)
        versions.append(schema_version(url))
    assert versions[0] == versions[1] == versions[2]


@pytest.mark.parametrize("behind", ["the revision before head", "a view gone", "a view changed"])
def test_a_sqlite_catalog_behind_the_code_is_upgraded_on_open(tmp_path: Path, behind: str) -> None:
    """An older revision, or views other than this code's, are upgraded by the job's open,
    with the rows kept."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = Catalog.open(url, upgrade="sqlite")
    Stream(catalog, [StoreId(0, 0)], root="/old").run(2)
    catalog.close()
    engine = create_catalog_engine(url)
    with engine.begin() as connection:
        if behind == "the revision before head":
            script = ScriptDirectory.from_config(alembic_config())
            previous = script.get_revision(head_revision()).down_revision
            assert isinstance(previous, str)
            downgrade(connection, previous)
        elif behind == "a view gone":
            connection.exec_driver_sql("DROP VIEW state_store_health")
        else:
            connection.exec_driver_sql("DROP VIEW state_lineage")
            connection.exec_driver_sql("CREATE VIEW state_lineage AS SELECT 1 AS version")
    with Catalog.open(url, upgrade="sqlite") as reopened:
        assert [v.ref.version for v in reopened.retained_versions("/old", StoreId(0, 0))] == [2, 1]
    with engine.connect() as connection:
        assert current_revision(connection) == head_revision()
    engine.dispose()
    assert_exactly_rendered(url)


# --- the status rule, rendered, on generated fleets -----------------------------------------

store_facts = st.fixed_dictionaries(
    {
        "commits": st.integers(1, 24),
        "snapshot": st.one_of(st.none(), st.integers(1, 24)),
        "orphans": st.integers(0, 3),
        "problems": st.lists(st.booleans(), max_size=2),  # each: still open?
        "validated": st.booleans(),
    }
)


def build_store(catalog: Catalog, root: str, store: StoreId, facts: dict[str, Any]) -> None:
    stream = Stream(catalog, [store], root=root, query=uuid.uuid4().hex)
    for version in range(1, facts["commits"] + 1):
        stream.commit()
        if facts["snapshot"] == version:
            stream.snapshot(store)
    for _ in range(facts["orphans"]):  # attempts at version 1 that lost: orphans
        catalog.record_files(root, [info(store, 1, None, created_at=stream.clock)])
    key = StoreKey(root, store)
    for still_open in facts["problems"]:
        run = catalog.start_run("validate", "tests")
        catalog.record_validation(run, key, {}, [FoundProblem("file is missing", "x", 1)])
        catalog.finish_run(run, "succeeded")
        if not still_open:
            run = catalog.start_run("validate", "tests")
            catalog.record_validation(run, key, {}, [])
            catalog.finish_run(run, "succeeded")
    if facts["validated"]:
        run = catalog.start_run("validate", "tests")
        found = [FoundProblem("file is missing", "x", 1)] if any(facts["problems"]) else []
        catalog.record_validation(run, key, {}, found)
        catalog.finish_run(run, "succeeded")


def when(value: object) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value.astimezone(UTC) if isinstance(value, datetime) else None
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fleet=st.lists(store_facts, min_size=1, max_size=4),
    lag=st.integers(1, 25),
    orphans=st.integers(1, 4),
)
def test_the_rendered_status_is_the_python_rule(
    catalog: Catalog, fleet: list[dict[str, Any]], lag: int, orphans: int
) -> None:
    root = f"/status/{uuid.uuid4().hex}"
    for i, facts in enumerate(fleet):
        build_store(catalog, root, StoreId(i, 0), facts)
    health = catalog.store_health(RetentionPolicy(), root=root)

    def python(lag: int, orphans: int) -> dict[int, tuple[object, ...]]:
        return {
            h.key.store.operator_id: (s.status.value, s.reason, s.since)
            for h in health
            for s in [store_status(h, lag_warn_deltas=lag, orphan_warn_files=orphans)]
        }

    def sql(query: str, **parameters: object) -> dict[int, tuple[object, ...]]:
        with catalog.engine.connect() as connection:
            rows = connection.execute(sa.text(query), {**parameters, "root": root}).all()
        return {r[0]: (r[1], r[2], when(r[3])) for r in rows}

    view = sql(
        "SELECT operator_id, status, status_reason, status_since FROM state_store_health"
        " WHERE checkpoint_root = :root"
    )
    assert view == python(DEFAULT_LIMITS["lag_warn_deltas"], DEFAULT_LIMITS["orphan_warn_files"])
    if catalog.dialect == "postgresql":
        function = sql(
            "SELECT s.operator_id, st.status, st.status_reason, st.status_since"
            " FROM state_store_status(:lag, :orphans) st JOIN stores s USING (store_id)"
            " WHERE s.checkpoint_root = :root",
            lag=lag,
            orphans=orphans,
        )
        assert function == python(lag, orphans)
