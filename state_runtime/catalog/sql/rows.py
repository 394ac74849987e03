"""Rows back to names and records: the store-column select, row -> StoreId/StoreKey, and the
file columns every answer about files selects (row -> FileRecord); over the tables (what
writes select: the constants) or the relations a read function receives."""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy.engine import Row

from state_runtime.catalog.records import FileRecord, StoreKey
from state_runtime.catalog.schema.tables import Verification, checkpoint_files, stores
from state_runtime.identity import FileKind, StoreId

AnyRow: TypeAlias = Row[*tuple[Any, ...]]

Columns = tuple[sa.ColumnElement[Any], ...]


def store_key_columns(s: sa.TableClause) -> Columns:
    """The columns of ``s`` (the stores table or its view) that name a store; :func:`key_of`
    reads them back from a row (and :func:`store_id_of` the last three)."""
    return (s.c.checkpoint_root, s.c.operator_id, s.c.partition_id, s.c.store_name)


STORE_KEY_COLUMNS = store_key_columns(stores)


KEYS_CACHED = 256
"""Store keys (and ids) kept built: a store's rows come together in an answer, so a few
hundred let a pass build a key once per store, not once per file row, while the cache stays
far below a fleet (at 65,536 it held a key per store of a 20,000-store fleet: 10 MB; at
2,048 it still grew with fleets of up to 2,048 stores, which a memory test at a few
thousand stores measures as growth)."""


@functools.lru_cache(maxsize=KEYS_CACHED)
def store_key(root: str, operator_id: int, partition_id: int, store_name: str) -> StoreKey:
    """A StoreKey, built (and validated) once per store rather than once per file row."""
    return StoreKey(root, store_id(operator_id, partition_id, store_name))


@functools.lru_cache(maxsize=KEYS_CACHED)
def store_id(operator_id: int, partition_id: int, store_name: str) -> StoreId:
    return StoreId(operator_id, partition_id, store_name)


def is_store(store: StoreId, table: sa.TableClause = stores) -> sa.ColumnElement[bool]:
    """The WHERE clause that picks ``store`` (any root) from ``table`` (stores or its view)."""
    s = table.c
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
        recorded_at,
        state,
        state_reason,
        verification,
        verified_at,
        verification_note,
    ) = row[:22]
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
        recorded_at=recorded_at,
        state=state,
        state_reason=state_reason,
        verification=_VERIFICATIONS[verification],
        verified_at=verified_at,
        verification_note=verification_note,
    )


def file_columns(f: sa.TableClause, s: sa.TableClause) -> Columns:
    """The columns :func:`file_record` reads, in its order, of ``f`` (checkpoint_files or
    its view) and ``s`` (stores or its view); queries may append columns after them."""
    names = (
        "file_id store_id path kind version checkpoint_id base_checkpoint_id size_bytes rows "
        "file_rows checksum created_at recorded_at state state_reason verification verified_at "
        "verification_note claimed_by_run"
    )
    return (*store_key_columns(s), *(f.c[name] for name in names.split()))


FILE_COLUMNS = file_columns(checkpoint_files, stores)
