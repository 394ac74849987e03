"""Verifying a checkpoint file's bytes against what was recorded about it.

A file is intact when it has the recorded size and checksum, parses and verifies (envelope
checksum, Arrow stream, header), carries the identity its name says (store, version,
checkpoint id, kind) and its lineage starts at the recorded base. A snapshot must also hold
the whole state: as many rows as the state has, and no removals. Validation, the snapshot pass
(right after writing) and repair all verify through :func:`verify_file`; each problem is one
sentence naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from state_runtime.errors import CannotLoadState, SchemaMismatch, StorageError, StorageFileNotFound
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.storage import Storage
from state_runtime.store.checkpoint_format import (
    SchemaLookup,
    check_identity,
    checksum,
    checksum_covers_file,
    decode,
    read_header,
    read_header_as_parsed,
)
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_header import FileHeader
from state_runtime.store.schema_files import fetch

MISSING = "file is missing from storage"
UNREADABLE = "file cannot be read"  # a storage error other than not-found: no verdict on it


@dataclass(frozen=True)
class Expected:
    """What a file must be: its identity, and the size and checksum recorded for it."""

    store: StoreId
    ref: CheckpointRef
    kind: FileKind
    path: str
    size: int
    checksum: str
    base_checkpoint_id: str | None


def expected_of(info: CheckpointInfo) -> Expected:
    """What a file just written (or found) must be: its identity, size and checksum."""
    return Expected(
        store=info.store,
        ref=info.ref,
        kind=info.kind,
        path=info.path,
        size=info.bytes_written,
        checksum=info.checksum,
        base_checkpoint_id=info.base_checkpoint_id,
    )


def verify_bytes(
    data: bytes,
    expected: Expected,
    schemas: SchemaLookup | None = None,
    *,
    rows: bool = False,
    parsed: bool = False,
) -> str | None:
    """The problem with ``data`` as the file ``expected`` describes, or None if intact.

    A format 3 delta's checksum covers every byte, so once it matches the recorded one the
    bytes are those recorded, whose rows parsed when they were recorded (the writer encoded
    them; reconcile parses a file before it records it: ``rows``): its envelope, header and
    identity are verified, its rows parsed again only given ``rows`` (then a schema that
    ``schemas`` does not know is a problem: the rows cannot be parsed). Parsing the rows is
    most of a tiny file's cost (0.6 of 0.7 ms), and validation reads every new delta. Older
    formats are decoded whole: their checksum is the digest their envelope claims, which only
    decoding checks; unless ``parsed``: the file was verified (decoded whole) before with the
    checksum recorded now, so once its payload hashes to it these are the bytes decoded then,
    and its envelope, header, row count and removals are checked on the rows as stored
    (validation's sample reading a verified snapshot again: decoding its narrow integer
    columns was most of its cost)."""
    if len(data) != expected.size:
        return f"size is {len(data)} bytes, the catalog recorded {expected.size}"
    if checksum(data) != expected.checksum:
        return "checksum differs from the one the catalog recorded"
    table: pa.Table | None
    try:
        if not rows and (parsed or checksum_covers_file(data)):  # the header suffices
            header, table = read_header_as_parsed(data, expected.path, expected.store, expected.ref)
        else:
            header, table = _decoded(data, expected, schemas, rows)
        check_identity(header, expected.store, expected.ref, expected.kind, expected.path)
    except CannotLoadState as exc:
        return exc.reason
    parent = header.lineage[0] if header.lineage else None
    base = expected.base_checkpoint_id
    wanted = None if base is None else CheckpointRef(expected.ref.version - 1, base)
    if parent != wanted:
        return (
            f"lineage in the file starts at {parent or 'version 0'}, the catalog says "
            f"{wanted or 'version 0'}"
        )
    if expected.kind is FileKind.SNAPSHOT:
        if header.file_rows != header.state_rows:
            return f"snapshot holds {header.file_rows} rows for a state of {header.state_rows}"
        if table is not None and table.column("value").null_count:
            return "snapshot holds removals"
    return None


def _decoded(
    data: bytes, expected: Expected, schemas: SchemaLookup | None, rows: bool
) -> tuple[FileHeader, pa.Table | None]:
    """The file's header and rows; a format 3 delta whose schema is not at hand: its header,
    unless its ``rows`` must be parsed (CannotLoadState: they cannot be)."""
    try:
        return decode(data, expected.path, expected.store, expected.ref, schemas)
    except SchemaMismatch as exc:
        if rows:
            raise CannotLoadState(
                f"rows cannot be parsed: {exc.reason}",
                store=expected.store,
                path=expected.path,
                version=expected.ref.version,
                checkpoint_id=expected.ref.checkpoint_id,
            ) from exc
        return read_header(data, expected.path, expected.store, expected.ref), None


def verify_file(
    storage: Storage, expected: Expected, *, parsed: bool = False
) -> tuple[str | None, int]:
    """Read the file and verify it: (problem or None, bytes read); ``parsed``: as
    :func:`verify_bytes`'."""
    try:
        data = storage.read(expected.path)
    except StorageFileNotFound:
        return MISSING, 0
    except StorageError as exc:
        return f"{UNREADABLE}: {exc.reason}", 0
    problem = verify_bytes(
        data, expected, lambda schema_id: fetch(storage, schema_id), parsed=parsed
    )
    return problem, len(data)
