"""Least privilege on real PostgreSQL: the four roles, each doing its work and refused cleanly
outside its rights; a catalog behind the code; a catalog that refuses writes.

The roles are cluster-wide objects, so each test run creates uniquely named ones (granted by
``python -m state_runtime.catalog grants --apply``, as the owner) and drops them afterwards.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from click.testing import CliRunner, Result
from pyspark.sql import SparkSession
from sqlalchemy.engine import make_url

from demo.clicks import parse_args, run
from state_runtime.catalog import BatchMetrics, Catalog
from state_runtime.catalog.__main__ import main as catalog_main
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.grants import Roles as GrantRoles
from state_runtime.catalog.schema.grants import reader_views
from state_runtime.catalog.schema.revision import (
    MIGRATIONS,
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)
from state_runtime.cli import main as statestore
from state_runtime.errors import (
    CatalogMisconfigured,
    CatalogPermissionDenied,
    CatalogReadOnly,
    CatalogSchemaOutdated,
    InvalidArgument,
)
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass
from state_runtime.storage import LocalStorage
from tests.catalog.conftest import _admin
from tests.maintenance.streams import StoreStream

pytestmark = pytest.mark.postgres
STORES = [StoreId(0, 0), StoreId(0, 1), StoreId(1, 0, "sessions")]


@dataclass
class Roles:
    """The catalog's URLs, one per role, and the roles' names."""

    owner: str
    runtime: str
    maintenance: str
    reader: str
    names: dict[str, str]


def url_as(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


@pytest.fixture
def roles(pg_schema: str) -> Iterator[Roles]:
    """A catalog at head (created by the owner), three uniquely named roles granted by the
    ``grants --apply`` command and allowed to log in; dropped afterwards."""
    upgrade(create_catalog_engine(pg_schema))
    suffix = uuid.uuid4().hex[:10]
    names = {k: f"sr_{k}_{suffix}" for k in ("runtime", "maintenance", "reader")}
    listed = ", ".join(f'"{n}"' for n in names.values())
    args = ["grants", "--url", pg_schema, "--apply"]
    args += [a for kind, name in names.items() for a in (f"--{kind}-role", name)]
    try:
        assert catalog_main(args) == 0
        admin = _admin()
        with admin.cursor() as cursor:
            for name in names.values():
                cursor.execute(f'ALTER ROLE "{name}" LOGIN')
        admin.close()
        yield Roles(pg_schema, *(url_as(pg_schema, names[k]) for k in names), names)
    finally:
        # their privileges and default privileges in this database, then the roles
        database = sa.create_engine(make_url(pg_schema).set(query={}))
        with database.begin() as connection:
            connection.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = ANY(:names)"
                ),
                {"names": list(names.values())},
            )
            known = connection.execute(
                sa.text("SELECT count(*) FROM pg_roles WHERE rolname = ANY(:names)"),
                {"names": list(names.values())},
            ).scalar()
            if known == len(names):
                connection.exec_driver_sql(f"DROP OWNED BY {listed}")
        database.dispose()
        admin = _admin()
        with admin.cursor() as cursor:
            cursor.execute(f"DROP ROLE IF EXISTS {listed}")
        admin.close()


def cli(url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "250", "STATE_CATALOG_URL": None})
    return runner.invoke(statestore, ["--catalog-url", url, "-q", *args], catch_exceptions=False)


def rows(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(sa.text(sql))]
    finally:
        engine.dispose()


def refused(url: str, sql: str) -> str:
    """The error PostgreSQL gives the role of ``url`` for ``sql`` (which must be refused)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection, pytest.raises(sa.exc.ProgrammingError) as caught:
            connection.execute(sa.text(sql))
        assert caught.value.orig.pgcode == "42501"  # type: ignore[union-attr]
        return str(caught.value.orig)
    finally:
        engine.dispose()


def counts(url: str) -> tuple[object, ...]:
    return rows(
        url,
        "SELECT (SELECT count(*) FROM stores), (SELECT count(*) FROM checkpoint_files), "
        "(SELECT count(*) FROM commit_log), (SELECT count(*) FROM maintenance_runs), "
        "(SELECT count(*) FROM deletion_ledger), (SELECT count(*) FROM store_leases)",
    )[0]


def runtime_stream(roles: Roles, tmp_path: Path) -> StoreStream:
    """What a streaming job records, as the runtime role: stores, files, commits (a replayed
    batch among them), batch metrics (recorded twice), holders and watermarks."""
    catalog = Catalog.open(roles.runtime, upgrade="sqlite")
    stream = StoreStream(catalog, LocalStorage(tmp_path / "checkpoint"), list(STORES))
    stream.run(10)
    stream.abandoned_attempt(STORES[0])
    for store in STORES:  # batch 9 replayed: version 10 again, with new ids
        stream.committed[store].pop()
        stream.states[store].pop()
    replayed = {store: stream.write(store) for store in STORES}
    infos = [info for info, _ in replayed.values()]
    catalog.begin_batch(stream.root, stream.query, stream.batch - 1, "replay9", [(0, "default", 1)])
    catalog.commit_batch(
        stream.root,
        stream.query,
        stream.batch - 1,
        infos,
        run="replay9",
        holders={infos[0].store: "worker-1"},
        suspects=[infos[0].store],
    )
    for store, (info, state) in replayed.items():
        stream.committed[store].append(info)
        stream.states[store].append(state)
    for _ in range(2):
        catalog.record_batch_metrics(
            stream.root, stream.query, 9, BatchMetrics(5, 5, 5, 5, 1.0, 0, 1)
        )
    catalog.fix_watermark(stream.root, stream.query, 9, 1000)
    catalog.record_max_event_time(stream.root, stream.query, 9, 2000)
    return stream


def test_the_grants_command_prints_the_roles_sql(
    pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(create_catalog_engine(pg_schema))
    assert catalog_main(["grants", "--url", pg_schema, "--reader-role", "ops_ro"]) == 0
    sql = capsys.readouterr().out
    assert 'CREATE ROLE "state_runtime" NOLOGIN' in sql and '"ops_ro"' in sql
    assert (
        "GRANT INSERT, UPDATE ON " in sql
        and " DELETE" not in sql.split('TO "state_runtime"')[0].split("GRANT INSERT, UPDATE ON")[-1]
    )
    assert rows(pg_schema, "SELECT count(*) FROM pg_roles WHERE rolname = 'ops_ro'") == [(0,)]
    assert catalog_main(["grants", "--url", pg_schema, "--reader-role", "Bad-Name"]) == 1
    assert "invalid role or schema name 'Bad-Name'" in capsys.readouterr().err


def test_statestore_catalog_answers_as_python_m_state_runtime_catalog(
    pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``statestore catalog upgrade|current|grants`` prints what ``python -m
    state_runtime.catalog`` prints, on the group's ``--catalog-url``, and fails the same way."""
    runner = CliRunner(env={"STATE_CATALOG_URL": None})
    group = ["--catalog-url", pg_schema, "catalog"]
    up = runner.invoke(statestore, [*group, "upgrade"])
    assert up.exit_code == 0 and f"revision {head_revision()}" in up.stdout, up.output
    assert catalog_main(["current", "--url", pg_schema]) == 0
    assert up.stdout == capsys.readouterr().out
    assert runner.invoke(statestore, [*group, "current"]).stdout == up.stdout
    grants = runner.invoke(statestore, [*group, "grants", "--reader-role", "ops_ro"])
    assert catalog_main(["grants", "--url", pg_schema, "--reader-role", "ops_ro"]) == 0
    assert grants.exit_code == 0 and grants.stdout == capsys.readouterr().out
    assert '"ops_ro"' in grants.stdout
    bad = runner.invoke(statestore, [*group, "grants", "--reader-role", "Bad-Name"])
    assert bad.exit_code != 0 and "invalid role or schema name 'Bad-Name'" in bad.stderr


def test_sqlite_has_no_roles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    Catalog.open(url, upgrade=True).close()
    assert catalog_main(["grants", "--url", url]) == 1
    assert "SQLite catalog is a single-user file" in capsys.readouterr().err


def test_each_role_does_its_work_and_is_refused_outside_it(roles: Roles, tmp_path: Path) -> None:
    stream = runtime_stream(roles, tmp_path)
    runtime, names = stream.catalog, roles.names

    # The runtime cannot delete a file row nor drop a table, and a Catalog operation that
    # needs a right it lacks is refused, typed, naming role, right and operation; no change.
    assert "permission denied for table checkpoint_files" in refused(
        roles.runtime, "DELETE FROM checkpoint_files"
    )
    assert "must be owner of table stores" in refused(roles.runtime, "DROP TABLE stores")
    assert "permission denied for schema" in refused(roles.runtime, "CREATE TABLE t (i int)")
    before = counts(roles.owner)
    with pytest.raises(CatalogPermissionDenied) as denied:
        cleanup_pass(Fleet(runtime, owner="runtime"), MaintenancePolicy(), dry_run=False)
    message = str(denied.value)
    assert f"role '{names['runtime']}' lacks INSERT" in message
    assert (
        "permission denied for table maintenance_runs" in message
        and "begin maintenance run" in message
    )
    assert counts(roles.owner) == before
    runtime.close()

    # Maintenance: snapshots, cleanup (deletions), validation, reconciliation; no DDL.
    done = cli(roles.maintenance, "--policy", "demo", "maintain", "--execute")
    assert done.exit_code == 0, done.output
    assert "3 written" in done.stdout
    assert counts(roles.owner)[4] > 0  # the ledger recorded the deletions
    for args in (("validate",), ("reconcile",), ("repair", "--execute")):
        result = cli(roles.maintenance, *args)
        assert result.exit_code == 0, (args, result.output)
    for version in (10, 11):
        for store in STORES:
            if version <= len(stream.committed[store]):
                assert stream.loaded(store, version) == stream.expected(store, version)
    assert "must be owner of table deletion_ledger" in refused(
        roles.maintenance, "DROP TABLE deletion_ledger"
    )
    assert "permission denied for schema" in refused(roles.maintenance, "CREATE TABLE t (i int)")
    assert "permission denied for table alembic_version" in refused(
        roles.maintenance, "DELETE FROM alembic_version"
    )

    # The reader: the operators' views and the CLI's read commands; it cannot write.
    health = rows(roles.reader, "SELECT count(*) FROM state_store_health")
    assert health == [(3,)]
    for args in (
        ("health",),
        ("history",),
        ("--root", stream.root, "explain", stream.committed[STORES[0]][-1].path),
    ):
        result = cli(roles.reader, *args)
        assert result.exit_code == 0, (args, result.output)
    assert "permission denied for table stores" in refused(
        roles.reader, "UPDATE stores SET latest_version = 0"
    )
    before = counts(roles.owner)
    written = cli(roles.reader, "maintain", "--execute")
    assert written.exit_code == 4, written.output
    assert f"role '{names['reader']}' lacks " in written.stderr
    with (
        Catalog.open(roles.reader) as reader,
        pytest.raises(CatalogPermissionDenied, match="lacks INSERT for the catalog register store"),
    ):
        reader.register_store(stream.root, StoreId(9, 9), "k string", "v bigint")
    assert counts(roles.owner) == before


def privileges(owner: str, role: str, kind: str) -> dict[str, set[str]]:
    """The rights ``role`` holds on each relation of ``kind`` ('BASE TABLE' or 'VIEW') of
    the catalog's schema."""
    found = rows(
        owner,
        "SELECT t.table_name, p.privilege FROM information_schema.tables t "
        "CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) "
        "AS p(privilege) WHERE t.table_schema = current_schema() "
        f"AND t.table_type = '{kind}' AND has_table_privilege('{role}', "
        "quote_ident(t.table_schema) || '.' || quote_ident(t.table_name), p.privilege)",
    )
    held: dict[str, set[str]] = {}
    for table, privilege in found:
        held.setdefault(str(table), set()).add(str(privilege))
    return held


def test_the_reader_reads_the_views_only(roles: Roles, tmp_path: Path) -> None:
    """The reader holds SELECT on the views and nothing on any table; every read command of
    ``statestore`` works as the reader (through the views); every write is refused, typed,
    and changes nothing. No role may write through a view."""
    stream = runtime_stream(roles, tmp_path)
    stream.catalog.close()
    reader, owner, names = roles.reader, roles.owner, roles.names
    assert privileges(owner, names["reader"], "BASE TABLE") == {}
    views = privileges(owner, names["reader"], "VIEW")
    assert views and all(held == {"SELECT"} for held in views.values()), views
    assert {"state_store_health", "read_checkpoint_files", "read_schema_revision"} <= set(views)
    for role in names.values():  # a view reads with its owner's rights: nobody writes one
        for view, held in privileges(owner, role, "VIEW").items():
            assert held <= {"SELECT"}, (role, view, held)
    for table in ("stores", "store_leases", "store_holders", "alembic_version", "catalog_roles"):
        assert f"permission denied for table {table}" in refused(reader, f"SELECT * FROM {table}")
    assert "permission denied for view read_stores" in refused(reader, "DELETE FROM read_stores")
    # the functions the views call read the reading views: the reader may call them too
    assert rows(reader, "SELECT count(*) FROM state_file_verdicts(2, '1 hour', '1 hour')")[0][0]

    store, latest = "0/0/default", stream.committed[STORES[0]][-1]
    reads = [
        ("health",),
        ("status", "--json"),
        ("health", "--store", store, "--sort", "reclaimable"),
        ("history",),
        ("history", "--by-batch", "--json"),
        ("history", "--schemas"),
        ("history", "--query", stream.query, "--store", store),
        ("--root", stream.root, "explain", latest.path),
        ("metrics", stream.root, "--query", stream.query),
        ("maintain",),  # a dry run: it plans, reading only
        ("repair",),  # a dry run too
    ]
    for args in reads:
        result = cli(reader, *args)
        assert result.exit_code in (0, 3) and not result.stderr, (args, result.stderr)
        assert "PERMISSION" not in result.output, args
    checked = cli(
        reader,
        "schema-check",
        stream.root,
        "--query",
        stream.query,
        "--operator",
        "0",
        "--value-schema",
        "v bigint, w string",
    )
    assert checked.exit_code in (0, 1) and "PERMISSION" not in checked.output, checked.output

    before = counts(owner)
    for args in (
        ("maintain", "--execute"),
        ("validate",),
        ("reconcile",),
        ("repair", "--execute"),
        ("resolve", "--store", store, "--reason", "by hand"),
    ):
        result = cli(reader, *args)
        assert result.exit_code == 4, (args, result.output)
        assert f"[STATE_CATALOG_PERMISSION_DENIED] role '{names['reader']}' lacks" in (
            result.stderr
        ), args
    with Catalog.open(reader) as catalog:
        with pytest.raises(CatalogPermissionDenied, match="register store"):
            catalog.register_store(stream.root, StoreId(9, 9), "k string", "v bigint")
        with pytest.raises(CatalogPermissionDenied, match="commit batch"):
            catalog.commit_batch(stream.root, stream.query, 99, [latest])
    assert counts(owner) == before


EXTRA_MIGRATION = """
import sqlalchemy as sa
from alembic import op

revision = "0099_extra_facts"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "extra_facts",
        sa.Column("fact_id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("fact", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("extra_facts")
"""


def write(url: str, sql: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(sql))
    finally:
        engine.dispose()


def test_an_upgrade_grants_the_tables_it_adds_and_the_views_it_recreates(
    roles: Roles, tmp_path: Path
) -> None:
    """A real migration that adds a table (the packaged ones plus one more, in a copy of the
    script folder), run as the owner after ``grants --apply``: without any manual step,
    maintenance writes the new table, the runtime reads it, the reader still sees the views
    alone (recreated by the upgrade) and every role keeps its rights on the old tables."""
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    extra = EXTRA_MIGRATION.format(head=head_revision())
    (scripts / "versions" / "0099_extra_facts.py").write_text(extra)
    config = alembic_config()
    config.set_main_option("script_location", str(scripts))
    engine = create_catalog_engine(roles.owner)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        assert current_revision(connection) == "0099_extra_facts"
    engine.dispose()
    names = roles.names

    write(roles.maintenance, "INSERT INTO extra_facts (fact) VALUES ('kept')")
    write(roles.maintenance, "UPDATE extra_facts SET fact = 'changed'")
    assert rows(roles.runtime, "SELECT fact FROM extra_facts") == [("changed",)]
    assert "permission denied for table extra_facts" in refused(
        roles.runtime, "INSERT INTO extra_facts (fact) VALUES ('x')"
    )
    assert "permission denied for table extra_facts" in refused(
        roles.reader, "SELECT * FROM extra_facts"
    )
    assert privileges(roles.owner, names["reader"], "BASE TABLE") == {}
    views = privileges(roles.owner, names["reader"], "VIEW")
    assert set(views) == set(reader_views()) and all(v == {"SELECT"} for v in views.values())
    for role in names.values():
        for view, held in privileges(roles.owner, role, "VIEW").items():
            assert held <= {"SELECT"}, (role, view, held)
    assert rows(roles.reader, "SELECT count(*) FROM state_store_health") == [(0,)]
    write(
        roles.runtime,
        "INSERT INTO stores (checkpoint_root, operator_id, partition_id, store_name, "
        "latest_version, created_at) VALUES ('file:///x', 0, 0, 'default', 0, now())",
    )
    write(roles.maintenance, "DELETE FROM extra_facts")
    assert "permission denied for table alembic_version" in refused(
        roles.maintenance, "UPDATE alembic_version SET version_num = 'x'"
    )
    assert "permission denied for table catalog_roles" in refused(
        roles.maintenance, "UPDATE catalog_roles SET role_name = 'x'"
    )


def test_dagster_jobs_run_as_maintenance(roles: Roles, tmp_path: Path) -> None:
    from dagster import instance_for_test, materialize

    from dagster_project.defs.assets import (
        state_reconciliation,
        state_retention_cleanup,
        state_snapshots,
    )
    from dagster_project.defs.resources import MaintenanceResource
    from tests.dagster.test_dagster_definitions import FAST, metadata

    stream = runtime_stream(roles, tmp_path)
    resources = {"maintenance": MaintenanceResource.of(FAST, catalog_url=roles.maintenance)}
    run_config = {"ops": {"state_retention_cleanup": {"config": {"dry_run": False}}}}
    with instance_for_test() as instance:
        snap = materialize([state_snapshots], resources=resources, instance=instance)
        assert metadata(snap, "state_snapshots")["written"] == 3
        clean = materialize(
            [state_retention_cleanup], resources=resources, instance=instance, run_config=run_config
        )
        assert metadata(clean, "state_retention_cleanup")["deleted_files"] > 0
        assert materialize([state_reconciliation], resources=resources, instance=instance).success
        reader = {"maintenance": MaintenanceResource.of(FAST, catalog_url=roles.reader)}
        failed = materialize(
            [state_snapshots], resources=reader, instance=instance, raise_on_error=False
        )
        assert not failed.success
    stream.catalog.close()


def test_a_catalog_behind_the_code_is_never_upgraded_by_the_runtime(pg_schema: str) -> None:
    engine = create_catalog_engine(pg_schema)
    upgrade(engine, "0007_views_everywhere")
    with pytest.raises(CatalogSchemaOutdated) as outdated:
        Catalog.open(pg_schema, upgrade="sqlite")  # what StatefulQuery does
    message = str(outdated.value)
    assert "0007_views_everywhere" in message and head_revision() in message
    assert (
        "as the catalog's owner" in message and "python -m state_runtime.catalog upgrade" in message
    )
    with engine.connect() as connection:
        assert current_revision(connection) == "0007_views_everywhere"
    engine.dispose()


def test_a_read_only_catalog_refuses_at_once_and_commits_once_when_back(
    roles: Roles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stream = runtime_stream(roles, tmp_path)
    infos = [stream.write(s)[0] for s in STORES]
    before = counts(roles.owner)
    admin = _admin()
    name = roles.names["runtime"]
    with admin.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{name}" SET default_transaction_read_only = on')
    try:
        with (
            Catalog.open(roles.runtime) as read_only,
            caplog.at_level(logging.WARNING),
            pytest.raises(CatalogReadOnly, match="refuses writes \\(commit batch\\)") as caught,
        ):
            read_only.commit_batch(stream.root, stream.query, stream.batch, infos)
        assert caught.value.retryable
        assert not [r for r in caplog.records if "transient error" in r.getMessage()]  # no retry
        assert counts(roles.owner) == before
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'ALTER ROLE "{name}" RESET default_transaction_read_only')
        admin.close()
    with Catalog.open(roles.runtime) as back:
        for _ in range(2):  # the caller's retry after the failover, and one more
            back.commit_batch(stream.root, stream.query, stream.batch, infos)
    committed = rows(
        roles.owner,
        f"SELECT count(*) FROM commit_log WHERE batch_id = {stream.batch}",
    )
    assert committed == [(len(STORES),)]
    stream.catalog.close()


def test_role_names_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="four distinct names"):
        GrantRoles("postgres", runtime="same", maintenance="same")
    with pytest.raises(InvalidArgument, match="invalid role or schema name"):
        GrantRoles("postgres", reader='x"; DROP TABLE stores; --')


@pytest.mark.spark
def test_the_demo_stream_runs_as_the_runtime_role(
    roles: Roles, spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--batches", "2", "--events-per-batch", "200", "--users", "40", "--partitions", "2"]
    argv += ["--output", str(tmp_path / "demo-output"), "--catalog-url", roles.runtime]
    assert run(spark, parse_args(argv)) == [0, 1]
    assert "done: 2 batches" in capsys.readouterr().out
    [root] = rows(roles.owner, "SELECT DISTINCT checkpoint_root FROM stores")[0]
    assert rows(roles.owner, "SELECT count(*) FROM maintenance_runs") == [(0,)]
    # ...and maintenance as its role on what the stream wrote
    done = cli(roles.maintenance, "--policy", "demo", "maintain", "--execute")
    assert done.exit_code == 0, done.output
    checked = cli(roles.maintenance, "validate")
    assert checked.exit_code == 0, checked.output
    assert cli(roles.reader, "--root", str(root), "health").exit_code == 0


SECRET = "pw-never-stored-7f3a"


def with_password(url: str) -> str:
    """``url`` carrying a password (trust authentication ignores it, as the server would not)."""
    return make_url(url).set(password=SECRET).render_as_string(hide_password=False)


def everything_in_the_catalog(owner: str) -> str:
    """Every row of every table of the catalog, as JSON text."""
    engine = sa.create_engine(owner)
    try:
        with engine.connect() as connection:
            tables = connection.execute(
                sa.text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
                )
            ).scalars()
            return "\n".join(
                text
                for table in list(tables)
                for text in connection.execute(
                    sa.text(f'SELECT row_to_json(t)::text FROM "{table}" t')
                ).scalars()
            )
    finally:
        engine.dispose()


def test_no_password_is_stored_or_logged_after_a_full_run(
    roles: Roles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dagster import instance_for_test, materialize

    from dagster_project.defs.assets import (
        state_reconciliation,
        state_retention_cleanup,
        state_snapshots,
        state_store_health,
    )
    from dagster_project.defs.resources import MaintenanceResource
    from tests.dagster.test_dagster_definitions import FAST
    from tests.dagster.test_dagster_secrets import everything_recorded

    runtime = Roles(
        roles.owner,
        *(with_password(u) for u in (roles.runtime, roles.maintenance, roles.reader)),
        roles.names,
    )
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG):
        stream = runtime_stream(runtime, tmp_path)
        stream.catalog.close()
        for url, args in [
            (runtime.maintenance, ("--policy", "demo", "maintain", "--execute")),
            (runtime.maintenance, ("validate",)),
            (runtime.maintenance, ("reconcile",)),
            (runtime.reader, ("health", "--json")),
            (runtime.reader, ("maintain", "--execute")),  # refused: its error names the URL
            (runtime.runtime, ("resolve", "--store", "0/0/default", "--reason", "x")),
        ]:
            result = cli(url, *args)
            seen += [result.stdout, result.stderr]
        assert "lacks SELECT" in seen[-3]  # the reader reads no table
        resources = {"maintenance": MaintenanceResource.of(FAST, catalog_url=runtime.maintenance)}
        failing = {"maintenance": MaintenanceResource.of(FAST, catalog_url=runtime.reader)}
        with instance_for_test() as instance:
            for assets, given in [
                ([state_snapshots, state_retention_cleanup], resources),
                ([state_reconciliation, state_store_health], resources),
                ([state_snapshots], failing),
            ]:
                done = materialize(assets, resources=given, instance=instance, raise_on_error=False)
                seen.append(everything_recorded(instance, done.run_id))
    seen += [r.getMessage() + str(r.exc_info or "") for r in caplog.records]
    stored = everything_in_the_catalog(roles.owner)
    assert "deletion" in stored or "superseded" in stored  # the scan reads real rows
    assert f"{roles.names['reader']}:***@" in "\n".join(seen)  # URLs shown masked ...
    for where, text in [("catalog rows", stored), ("logs and outputs", "\n".join(seen))]:
        assert SECRET not in text, where  # ... never their passwords


def test_tls_parameters_of_the_url_reach_the_driver(roles: Roles, tmp_path: Path) -> None:
    """sslmode and sslrootcert pass through to libpq: ``disable`` connects (and the session's
    parameters say so), ``require`` against this server (built without SSL) is refused by
    libpq itself, and ``verify-full`` names the root certificate file it could not read."""
    plain = make_url(roles.reader)
    with Catalog.open(plain.update_query_dict({"sslmode": "disable"}).render_as_string(False)) as c:
        with c.engine.connect() as connection:
            dsn = connection.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
        assert dsn["sslmode"] == "disable" and dsn["user"] == roles.names["reader"]
    with pytest.raises(CatalogMisconfigured, match="server does not support SSL"):
        Catalog.open(plain.update_query_dict({"sslmode": "require"}).render_as_string(False))
    missing = tmp_path / "ca.pem"
    verify = {"sslmode": "verify-full", "sslrootcert": str(missing)}
    with pytest.raises(CatalogMisconfigured) as caught:
        Catalog.open(plain.update_query_dict(verify).render_as_string(False))
    assert str(missing) in str(caught.value) or "SSL" in str(caught.value)


def test_a_right_missing_midway_leaves_nothing_half_written(roles: Roles, tmp_path: Path) -> None:
    """The runtime without INSERT on the commit log: a batch commit records its stores and
    files (allowed) and then is refused at the commit log; the one transaction rolls back."""
    engine = sa.create_engine(roles.owner)
    with engine.begin() as connection:
        connection.exec_driver_sql(f'REVOKE INSERT ON commit_log FROM "{roles.names["runtime"]}"')
    engine.dispose()
    catalog = Catalog.open(roles.runtime)
    stream = StoreStream(catalog, LocalStorage(tmp_path / "checkpoint"), list(STORES))
    before = counts(roles.owner)
    with pytest.raises(CatalogPermissionDenied) as denied:
        stream.commit()
    assert "lacks INSERT for the catalog commit batch" in str(denied.value)
    assert "permission denied for table commit_log" in str(denied.value)
    assert counts(roles.owner) == before  # no store, no file row: nothing half-written
    catalog.close()


def test_a_reading_view_plans_as_its_table(pg_schema: str) -> None:
    """The reads go through the reading views at no cost: PostgreSQL inlines the projection,
    and a lookup plans as the same index scan on the table."""
    upgrade(create_catalog_engine(pg_schema))
    where = "WHERE store_id = 1 AND version = 2"
    plans = [
        rows(pg_schema, f"EXPLAIN SELECT path FROM {name} {where}")
        for name in ("read_checkpoint_files", "checkpoint_files")
    ]
    assert plans[0] == plans[1] and "Index Scan" in str(plans[0][0][0])
