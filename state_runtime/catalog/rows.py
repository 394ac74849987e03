"""Rows back to names and records: the store-column select, row -> StoreId/StoreKey, and the
file columns every answer about files selects (row -> FileRecord)."""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy.engine import Row

from state_runtime.catalog.records import FileRecord, StoreKey
from state_runtime.catalog.tables import Verification, checkpoint_files, stores
from state_runtime.identity import FileKind, StoreId

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


def is_store(store: StoreId) -> sa.ColumnElement[bool]:
    """The WHERE clause that picks ``store`` (any root) from the stores table."""
    s = stores.c
    return sa.and_(
        s.operator_id == store.operator_id,
        s.partition_id == store.partition_id,
        s.store_name == store.store_name,
    )


def key_of(row: Any) -> StoreKey:
    """The StoreKey of a row that selected STORE_KEY_COLUMNS."""
    return store_key(row.checkpoint_root, row.operator_id, row.partition_id, row.store_name)


def store_id_of(row: Any) -> StoreId:
    """The StoreId of a row that selected ``operator_id``, ``partition_id``, ``store_name``."""
    return store_id(row.operator_id, row.partition_id, row.store_name)


_KINDS = {kind.value: kind for kind in FileKind}
_VERIFICATIONS = {v.value: v for v in Verification}


def file_record(row: AnyRow) -> FileRecord:
    """A FileRecord from a row that starts with FILE_COLUMNS (positional: this runs once per
    file in answers of hundreds of thousands of rows)."""
    (
        root,
        operator_id,
        partition_id,
        store_name,
        _file_id,
        _store_id,
        path,
        kind,
        version,
        checkpoint_id,
        base_checkpoint_id,
        size_bytes,
        rows,
        file_rows,
        checksum,
        created_at,
        state,
        state_reason,
        verification,
        verified_at,
        verification_note,
    ) = row[:21]
    return FileRecord(
        key=store_key(root, operator_id, partition_id, store_name),
        path=path,
        kind=_KINDS[kind],
        version=version,
        checkpoint_id=checkpoint_id,
        base_checkpoint_id=base_checkpoint_id,
        size_bytes=size_bytes,
        rows=rows,
        file_rows=file_rows,
        checksum=checksum,
        created_at=created_at,
        state=state,
        state_reason=state_reason,
        verification=_VERIFICATIONS[verification],
        verified_at=verified_at,
        verification_note=verification_note,
    )


# The columns file_record reads, in its order; queries may append columns after them.
FILE_COLUMNS = (
    *STORE_KEY_COLUMNS,
    checkpoint_files.c.file_id,
    checkpoint_files.c.store_id,
    checkpoint_files.c.path,
    checkpoint_files.c.kind,
    checkpoint_files.c.version,
    checkpoint_files.c.checkpoint_id,
    checkpoint_files.c.base_checkpoint_id,
    checkpoint_files.c.size_bytes,
    checkpoint_files.c.rows,
    checkpoint_files.c.file_rows,
    checkpoint_files.c.checksum,
    checkpoint_files.c.created_at,
    checkpoint_files.c.state,
    checkpoint_files.c.state_reason,
    checkpoint_files.c.verification,
    checkpoint_files.c.verified_at,
    checkpoint_files.c.verification_note,
    checkpoint_files.c.claimed_by_run,
)
