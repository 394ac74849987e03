"""The ``catalog`` of the orchestrator suites (tests/airflow, tests/dagster): SQLite unless a
test asks for both dialects (``@BOTH_CATALOGS``). The layers above the library are the same on
either; the library's own tests cover both. A suite's conftest imports ``catalog`` with the
maintenance fixtures (``sqlite_catalog``, ``pg_catalog``) it picks from."""

from __future__ import annotations

import pytest

from state_runtime.catalog import Catalog
from tests.catalog.conftest import DIALECTS

BOTH_CATALOGS = pytest.mark.parametrize("catalog", DIALECTS, indirect=True)


@pytest.fixture
def catalog(request: pytest.FixtureRequest) -> Catalog:
    """SQLite unless a test asks for both (``@BOTH_CATALOGS``)."""
    dialect = getattr(request, "param", "sqlite")
    fixture = "sqlite_catalog" if dialect == "sqlite" else "pg_catalog"
    found: Catalog = request.getfixturevalue(fixture)
    return found
