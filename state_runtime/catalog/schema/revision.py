"""The catalog schema's revision: upgrade it (Alembic), and refuse to run against an old one."""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection, Engine

from state_runtime.catalog.connection.engine import (
    RetryPolicy,
    create_sqlite_folder,
    display_url,
    run_transaction,
    sqlite_file,
)
from state_runtime.catalog.schema import operator_views as views
from state_runtime.catalog.schema import reading_views as reading
from state_runtime.errors import CatalogError, CatalogSchemaOutdated, CatalogSchemaTooNew

MIGRATIONS = Path(__file__).with_name("migrations")
ALEMBIC_INI = Path(__file__).with_name("alembic.ini")


def alembic_config() -> Config:
    """An Alembic configuration pointing at the packaged migrations."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision the packaged migrations have (read once per process)."""
    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(rev.revision for rev in script.walk_revisions())


@functools.cache
def head_revision() -> str:
    """The newest revision this code knows; the schema it expects (read once per process)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise CatalogError("the packaged catalog migrations have no head revision")
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for an empty database."""
    return MigrationContext.configure(connection).get_current_revision()


def checked_revision(connection: Connection) -> str | None:
    """The revision as every process checks it: through its reading view where the schema has
    one (the reader role reads no table), else from Alembic's table (an older schema)."""
    if sa.inspect(connection).has_table(reading.REVISION_VIEW):
        view = sa.table(reading.REVISION_VIEW, sa.column("version_num"))
        found: str | None = connection.execute(sa.select(view.c.version_num)).scalar()
        return found
    return current_revision(connection)


def upgrade_command(engine: Engine) -> str:
    """The shell command that upgrades this catalog, for error messages."""
    return f"python -m state_runtime.catalog upgrade --url '{display_url(engine.url)}'"


def upgrade(engine: Engine, revision: str = "head", *, retry: RetryPolicy | None = None) -> bool:
    """Migrate the database to ``revision`` (default: head) in one transaction.

    PostgreSQL and SQLite both run DDL transactionally, so a failed upgrade leaves the schema
    as it was; run again after a lost COMMIT, it finds the work done. A database at a
    revision this code does not know (newer code wrote it) raises CatalogSchemaTooNew and is
    left untouched. Creates the folder of a SQLite catalog. A SQLite catalog already at head
    with exactly this code's views is left as it is (what every open of a streaming job's
    catalog meets): the upgrade would change nothing. True then (the schema is the one
    :func:`check_schema` wants), else False.
    """
    create_sqlite_folder(engine)

    def work(connection: Connection) -> bool:
        found = current_revision(connection)
        _refuse_unknown(engine, found)
        if revision == "head" and _sqlite_at_head(connection, found):
            return True
        config = alembic_config()
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, revision)
        except CommandError as exc:
            raise CatalogError(f"cannot upgrade the catalog to {revision!r}: {exc}") from None
        return False

    return run_transaction(engine, work, retry=retry or RetryPolicy(), what="schema upgrade")


def _sqlite_at_head(connection: Connection, found: str | None) -> bool:
    """Whether a SQLite catalog is at the head revision with exactly the views this code
    renders, as an upgrade would leave it (SQLite keeps each view's CREATE statement as
    given). Never for PostgreSQL, whose upgrade also applies the recorded grants again."""
    if connection.dialect.name != "sqlite" or found != head_revision():
        return False
    ours = set(views.names())
    rows = connection.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'view'")
    present = {name: sql.strip() for name, sql in rows if name in ours}
    return present == {d.name: d.statements[0].strip() for d in views.rendered("sqlite")}


def _refuse_unknown(engine: Engine, found: str | None) -> None:
    """CatalogSchemaTooNew if the database is at a revision these migrations do not have."""
    if found is None:
        return
    if found not in known_revisions():
        raise CatalogSchemaTooNew(
            f"the catalog at {display_url(engine.url)} is at schema revision {found}, which this "
            f"version of state_runtime does not know (its newest is {head_revision()}): a newer "
            "version wrote it; upgrade state_runtime"
        )


def check_schema(engine: Engine, *, retry: RetryPolicy | None = None) -> str:
    """Return the head revision if the database is at it, else raise CatalogSchemaOutdated
    (older or empty: run the upgrade) or CatalogSchemaTooNew (upgrade the code). A SQLite
    catalog whose file does not exist is reported as having no schema, and is not created."""
    expected = head_revision()
    how = f"run, as the catalog's owner (the role that runs migrations): {upgrade_command(engine)}"
    path = sqlite_file(engine.url)
    if path is not None and not path.is_file():
        raise CatalogSchemaOutdated(
            f"the catalog at {str(path)!r} has no schema yet: the file does not exist, nothing "
            f"has been recorded there; to create it, {how}"
        )
    found = run_transaction(
        engine, checked_revision, retry=retry or RetryPolicy(), what="schema check"
    )
    if found == expected:
        return expected
    if found is None:
        raise CatalogSchemaOutdated(
            f"the catalog at {display_url(engine.url)} has no schema yet (expected revision "
            f"{expected}); {how}"
        )
    _refuse_unknown(engine, found)
    raise CatalogSchemaOutdated(
        f"the catalog at {display_url(engine.url)} is at schema revision {found}, this code "
        f"needs {expected}; {how}"
    )
