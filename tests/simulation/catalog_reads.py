"""The simulation's reads of the catalog (``machine.py``'s invariants): taken once per
change of the catalog, not once per check."""

from __future__ import annotations

import functools
import sqlite3

from state_runtime.catalog import RetainedVersion
from state_runtime.catalog.connection.engine import parse_url, sqlite_file
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance import StoreStatus, store_reports
from state_runtime.store.schema_history import SchemaHistory
from tests.simulation.platform import Platform, policy


class CatalogReads:
    """What the invariants read from the catalog, as of one ``data_version`` of it, each read
    when first asked for: the commit log, the retained versions, the schema histories and
    the stores health calls broken (a store is broken by its open problems: the catalog's
    content alone, whatever the clock)."""

    def __init__(self, platform: Platform, stores: list[StoreId], version: int | None) -> None:
        self.platform, self.stores, self.version = platform, stores, version

    @functools.cached_property
    def committed(self) -> dict[int, dict[StoreId, CheckpointRef]]:
        return self.platform.committed_refs()

    @functools.cached_property
    def retained(self) -> list[RetainedVersion]:
        p = self.platform
        by_store = p.catalog.retained_versions_of(p.root, self.stores)
        return [v for versions in by_store.values() for v in versions]

    @functools.cached_property
    def histories(self) -> dict[tuple[int, str], SchemaHistory]:
        return self.platform.catalog.schema_histories(self.platform.root)

    @functools.cached_property
    def broken(self) -> frozenset[StoreId]:
        """Health may record status changes (a commit): the next reads are then taken
        again, at the version after it."""
        p = self.platform
        reports = store_reports(p.fleet, policy(False), now=p.now())
        return frozenset(r.key.store for r in reports if r.status.status is StoreStatus.BROKEN)


class CatalogVersion:
    """SQLite's ``PRAGMA data_version`` on a connection of its own that never writes: it
    changes whenever another connection commits (sqlite.org/pragma.html#pragma_data_version),
    so reads taken at one value hold until it changes. None for other databases (every check
    reads the catalog again)."""

    def __init__(self, url: str) -> None:
        path = sqlite_file(parse_url(url))
        self._connection = None if path is None else sqlite3.connect(path)

    def __call__(self) -> int | None:
        if self._connection is None:
            return None
        return int(self._connection.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
