"""One cache of compiled statements for every catalog engine of a process.

SQLAlchemy keeps the statements an engine compiled in that engine's own cache, keyed by its
dialect object, so every catalog opened in a process (each query object's, a new driver's, a
maintenance fleet's, each Dagster run's) compiled every statement it runs again: a catalog's
first calls cost several times its later ones. :data:`COMPILED` is shared by every engine
:func:`~state_runtime.catalog.connection.engine.create_catalog_engine` creates (SQLAlchemy's
``compiled_cache`` execution option): it keys a compiled statement by what its text and its
bind and result processing depend on (the dialect's class, the server's version, the
identifier lengths, and the folder a SQLite catalog stores local roots against, which the
``CheckpointRoot`` column type reads from the dialect) instead of the dialect object.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.util import LRUCache

from state_runtime.catalog.sql.roots import folder_of

SIZE = 2000
"""Compiled statements kept (least recently used dropped first): the catalog runs a few
hundred shapes per dialect; SQLAlchemy's per-engine default is 500."""


def dialect_key(dialect: Dialect) -> Hashable:
    """What a compiled statement of ``dialect`` depends on, beyond the statement itself: two
    engines with equal keys compile every statement to the same text and processors."""
    return (
        type(dialect),
        dialect.server_version_info,
        dialect.max_identifier_length,
        dialect.label_length,
        dialect.paramstyle,
        folder_of(dialect),
    )


class SharedCompiledCache:
    """SQLAlchemy's compiled cache (``get`` and item assignment, keyed by ``(dialect, statement
    key, ...)``) with the dialect object replaced by :func:`dialect_key`."""

    def __init__(self, size: int = SIZE) -> None:
        self._cache: LRUCache[Hashable, Any] = LRUCache(size)
        self._lock = threading.Lock()

    @staticmethod
    def _key(key: tuple[Any, ...]) -> Hashable:
        return (dialect_key(key[0]), *key[1:])

    def get(self, key: tuple[Any, ...], default: Any = None) -> Any:
        return self._cache.get(self._key(key), default)

    def __setitem__(self, key: tuple[Any, ...], value: Any) -> None:
        with self._lock:
            self._cache[self._key(key)] = value

    def __len__(self) -> int:
        return len(self._cache)


COMPILED = SharedCompiledCache()
"""The process's compiled statements, shared by every catalog engine."""
