"""Rows back to names: the one home of the store-column select and of row -> StoreId/StoreKey."""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

from sqlalchemy.engine import Row

from state_runtime.catalog.records import StoreKey
from state_runtime.catalog.tables import stores
from state_runtime.identity import StoreId

AnyRow: TypeAlias = Row[*tuple[Any, ...]]

STORE_KEY_COLUMNS = (
    stores.c.checkpoint_root,
    stores.c.operator_id,
    stores.c.partition_id,
    stores.c.store_name,
)
"""The columns that name a store; :func:`key_of` reads them back from a row (and
:func:`store_id_of` the last three)."""


@functools.lru_cache(maxsize=65536)
def store_key(root: str, operator_id: int, partition_id: int, store_name: str) -> StoreKey:
    """A StoreKey, built (and validated) once per store rather than once per file row."""
    return StoreKey(root, store_id(operator_id, partition_id, store_name))


@functools.lru_cache(maxsize=65536)
def store_id(operator_id: int, partition_id: int, store_name: str) -> StoreId:
    return StoreId(operator_id, partition_id, store_name)


def key_of(row: Any) -> StoreKey:
    """The StoreKey of a row that selected STORE_KEY_COLUMNS."""
    return store_key(row.checkpoint_root, row.operator_id, row.partition_id, row.store_name)


def store_id_of(row: Any) -> StoreId:
    """The StoreId of a row that selected ``operator_id``, ``partition_id``, ``store_name``."""
    return store_id(row.operator_id, row.partition_id, row.store_name)
