"""The catalog's own commands, on a catalog URL: upgrade the schema, report its revision,
print or apply the roles' grants. ``python -m state_runtime.catalog`` and ``statestore
catalog`` both run these."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine

from state_runtime.catalog.connection.engine import (
    RetryPolicy,
    create_catalog_engine,
    display_url,
    run_transaction,
    sqlite_file,
)
from state_runtime.catalog.schema.grants import catalog_grants
from state_runtime.catalog.schema.revision import current_revision, head_revision, upgrade
from state_runtime.errors import CatalogSchemaOutdated


@contextmanager
def _engine(url: str) -> Iterator[Engine]:
    engine = create_catalog_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def revision_line(url: str) -> str:
    """``<url>: revision R (head: H)``. Reading never creates a SQLite catalog: a missing file
    is CatalogSchemaOutdated."""
    with _engine(url) as engine:
        return _revision_line(engine)


def _revision_line(engine: Engine) -> str:
    missing = sqlite_file(engine.url)
    if missing is not None and not missing.is_file():
        raise CatalogSchemaOutdated(f"no catalog at {str(missing)!r}: no such file")
    found = run_transaction(engine, current_revision, retry=RetryPolicy(), what="read revision")
    return f"{display_url(engine.url)}: revision {found or '(empty)'} (head: {head_revision()})"


def upgrade_catalog(url: str, revision: str = "head") -> str:
    """Migrate the catalog to ``revision`` (default: head); its revision line after."""
    with _engine(url) as engine:
        upgrade(engine, revision)
        return _revision_line(engine)


def grant_statements(
    url: str,
    *,
    owner: str | None = None,
    runtime: str | None = None,
    maintenance: str | None = None,
    reader: str | None = None,
    apply: bool = False,
) -> list[str]:
    """The SQL that creates the roles and grants their rights (run as the owner when
    ``apply``): see :mod:`state_runtime.catalog.schema.grants`."""
    with _engine(url) as engine:
        return catalog_grants(
            engine,
            owner=owner,
            runtime=runtime,
            maintenance=maintenance,
            reader=reader,
            apply=apply,
        )
