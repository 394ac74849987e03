"""Maintenance fixtures: catalogs on SQLite and PostgreSQL, and stores with real files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet
from state_runtime.storage import LocalStorage
from tests.catalog.conftest import (  # noqa: F401  (fixtures)
    catalog,
    pg_catalog,
    pg_database,
    sqlite_catalog,
)
from tests.maintenance.streams import StoreStream

STORES = [StoreId(0, 0), StoreId(0, 1), StoreId(1, 0, "sessions")]


@pytest.fixture
def make_stream(tmp_path: Path, catalog: Catalog) -> Callable[..., StoreStream]:  # noqa: F811
    """Builds a stream of stores on a fresh local root (``name``) in ``catalog``."""

    def make(
        name: str = "checkpoint", stores: list[StoreId] | None = None, **kw: object
    ) -> StoreStream:
        storage = LocalStorage(tmp_path / name)
        return StoreStream(catalog, storage, list(stores or STORES), **kw)  # type: ignore[arg-type]

    return make


@pytest.fixture
def fleet(catalog: Catalog) -> Fleet:  # noqa: F811
    return Fleet(catalog, owner="tests")
