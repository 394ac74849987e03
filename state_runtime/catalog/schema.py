"""The catalog schema's revision: upgrade it (Alembic), and refuse to run against an old one."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from state_runtime.catalog.engine import RetryPolicy, redact, run_transaction
from state_runtime.errors import CatalogError, CatalogSchemaOutdated

MIGRATIONS = Path(__file__).with_name("migrations")
ALEMBIC_INI = Path(__file__).with_name("alembic.ini")


def alembic_config() -> Config:
    """An Alembic configuration pointing at the packaged migrations."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    """The newest revision this code knows; the schema it expects."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise CatalogError("the packaged catalog migrations have no head revision")
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for an empty database."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade_command(engine: Engine) -> str:
    """The shell command that upgrades this catalog, for error messages."""
    return f"python -m state_runtime.catalog upgrade --url '{redact(engine.url)}'"


def upgrade(engine: Engine, revision: str = "head", *, retry: RetryPolicy | None = None) -> None:
    """Migrate the database to ``revision`` (default: head) in one transaction.

    PostgreSQL and SQLite both run DDL transactionally, so a failed upgrade leaves the schema
    as it was.
    """

    def work(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    run_transaction(engine, work, retry=retry or RetryPolicy(), what="schema upgrade")


def check_schema(engine: Engine, *, retry: RetryPolicy | None = None) -> str:
    """Return the head revision if the database is at it, else raise CatalogSchemaOutdated."""
    expected = head_revision()
    found = run_transaction(
        engine, current_revision, retry=retry or RetryPolicy(), what="schema check"
    )
    if found == expected:
        return expected
    script = ScriptDirectory.from_config(alembic_config())
    how = f"run: {upgrade_command(engine)}"
    if found is None:
        raise CatalogSchemaOutdated(
            f"the catalog at {redact(engine.url)} has no schema yet (expected revision "
            f"{expected}); {how}"
        )
    known = {rev.revision for rev in script.walk_revisions()}
    if found not in known:
        raise CatalogError(
            f"the catalog at {redact(engine.url)} is at revision {found}, which this version of "
            f"state_runtime does not know (newest known: {expected}); upgrade state_runtime"
        )
    raise CatalogSchemaOutdated(
        f"the catalog at {redact(engine.url)} is at schema revision {found}, this code needs "
        f"{expected}; {how}"
    )
