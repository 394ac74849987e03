"""Reading and writing checkpoint files (formats 1 to 3; see docs/checkpoint-format.md).

Deltas are written in format 3 (:mod:`state_runtime.store.compact_format`): a 14-byte
envelope with a CRC-32 over every later byte, binary header fields, the schema named by its id
in the store's schema history, the rows as bare Arrow buffers. Snapshots, which carry the
schema for everyone, are written in format 2: a 52-byte envelope (magic, format version,
payload length, SHA-256 of the payload) followed by an Arrow IPC stream whose schema metadata
holds a JSON header (kind, store identity, version, checkpoint id, lineage, key/value schemas
and row counts). Rows are a ``key`` struct column and a ``value`` struct column; in a delta a
null value removes the key. Formats 2 and 3 store integer fields narrow
(:mod:`state_runtime.store.column_encoding`); format 1 files are still read, as are format 2
deltas. Nothing is ever unpickled: parsing a file cannot execute code.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from state_runtime import errors
from state_runtime.errors import CheckpointFileCorrupt, InvalidArgument, UnexpectedVersion
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.store import compact_format
from state_runtime.store.column_encoding import ENCODINGS_KEY, decode_table, encode_table
from state_runtime.store.config import Compression
from state_runtime.store.file_header import JSON_FORMAT_VERSION, FileHeader
from state_runtime.store.file_header import now as now
from state_runtime.store.state_schema import StateSchema

MAGIC = b"STRTCKPT"
FORMAT_VERSION = JSON_FORMAT_VERSION
"""The format snapshots are written in (and deltas of rows format 3 cannot hold)."""
DELTA_FORMAT_VERSION = compact_format.COMPACT_FORMAT_VERSION
READABLE_VERSIONS = (1, 2, 3)
_ENVELOPE = struct.Struct("<8sHHQ32s")  # magic, format version, reserved, length, sha256
ENVELOPE_SIZE = _ENVELOPE.size
HEADER_KEY = b"state_runtime.header"
BATCH_BYTES = 1 << 20
"""A format 2 file's rows go in record batches of about this many bytes (as decoded), so that
a reader can take a large snapshot a batch at a time
(:mod:`state_runtime.store.snapshot_stream`)."""

THREADED_BYTES = 1 << 20
"""A file's Arrow stream is compressed or decompressed on Arrow's thread pool from this many
bytes (decoded, resp. stored); a smaller one on the calling thread, as handing its few
buffers to the pool costs more than the work (a tiny store's snapshot: most of its CPU)."""

SchemaLookup = Callable[[str], StateSchema | None]
"""Maps a schema id to its schema (e.g. :meth:`SchemaHistory.schema_of`): how a format 3
delta's rows find the schema it names. None where the caller has no history."""

__all__ = ["FileHeader", "now"]


def encode(
    header: FileHeader,
    keys: pa.StructArray,
    values: pa.StructArray,
    compression: Compression = "zstd",
    compression_level: int | None = None,
    *,
    in_key_order: bool = False,
) -> bytes:
    """Serialize rows into a checkpoint file, sorted by key unless ``in_key_order`` says they
    are already (or the key type has no order), integer fields stored narrow: a delta in
    format 3 (when its types fit and its rows fit one record batch), a snapshot or a larger
    delta in format 2, whose record batches a reader can take one at a time."""
    table = pa.table({"key": keys, "value": values})
    if not in_key_order:
        table, in_key_order = _sorted_by_key(table)
    batch_rows = batch_rows_of(table)
    table, encodings = encode_table(table, in_key_order=in_key_order)
    compact = table.num_rows <= batch_rows and compact_format.fits(table)
    if header.kind is FileKind.DELTA and header.schema_id and compact:
        return compact_format.encode(
            MAGIC, header, table, encodings, compression, compression_level
        )
    return encode_json_format(
        header, table, encodings, compression, compression_level, batch_rows=batch_rows
    )


def batch_rows_of(table: pa.Table) -> int:
    """Rows per record batch for ``table``'s rows (as decoded): about :data:`BATCH_BYTES`."""
    return batch_rows(int(table.nbytes), int(table.num_rows))


def batch_rows(nbytes: int, rows: int) -> int:
    """Rows per record batch for ``rows`` rows of ``nbytes`` bytes (as decoded)."""
    per_row = max(1, nbytes // max(1, rows))
    return max(1, BATCH_BYTES // per_row)


def encode_json_format(
    header: FileHeader,
    table: pa.Table,
    encodings: dict[str, Any],
    compression: Compression = "zstd",
    compression_level: int | None = None,
    *,
    batch_rows: int | None = None,
) -> bytes:
    """Format 2: the 52-byte envelope and an Arrow IPC stream with the JSON header (rows as
    :func:`encode_table` stored them), in record batches of ``batch_rows`` rows (None: one)."""
    metadata = {HEADER_KEY: header.to_json()}
    if encodings:
        metadata[ENCODINGS_KEY] = json.dumps(encodings, separators=(",", ":")).encode()
    arrow_schema = table.schema.with_metadata(metadata)
    codec = None if compression == "none" else pa.Codec(compression, compression_level)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec, use_threads=table.nbytes >= THREADED_BYTES)
    with pa.ipc.new_stream(sink, arrow_schema, options=options) as writer:
        writer.write_table(
            table.replace_schema_metadata(arrow_schema.metadata), max_chunksize=batch_rows
        )
    payload: bytes = sink.getvalue().to_pybytes()
    return envelope(len(payload), hashlib.sha256(payload).digest()) + payload


def envelope(length: int, digest: bytes) -> bytes:
    """The 52-byte envelope of a format 2 file whose payload has ``length`` bytes and SHA-256
    ``digest``."""
    return _ENVELOPE.pack(MAGIC, FORMAT_VERSION, 0, length, digest)


def _sorted_by_key(table: pa.Table) -> tuple[pa.Table, bool]:
    """The rows in key order and True, or as they are and False (key types without order)."""
    if table.num_rows < 2:
        return table, True
    key_children = table.column("key").combine_chunks().flatten()
    names = [f"k{i}" for i in range(len(key_children))]
    try:
        order = pc.sort_indices(
            pa.table(dict(zip(names, key_children, strict=True))),
            sort_keys=[(n, "ascending") for n in names],
        )
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return table, False  # key types without an order (maps): leave unsorted
    return table.take(order), True


def checksum(data: bytes) -> str:
    """What the catalog records as a file's checksum (SHA-256 as hex): of the payload in
    formats 1 and 2 (the envelope holds it), of the whole file in format 3."""
    if format_of(data) == DELTA_FORMAT_VERSION:
        return hashlib.sha256(data).hexdigest()
    return data[20:ENVELOPE_SIZE].hex() if len(data) >= ENVELOPE_SIZE else ""


def checksum_covers_file(data: bytes) -> bool:
    """Whether :func:`checksum` hashes every byte of ``data`` (format 3): a match with the
    recorded checksum then means these are the very bytes recorded. In formats 1 and 2 it is
    the digest the envelope claims for the payload, which only decoding checks."""
    return format_of(data) == DELTA_FORMAT_VERSION


def format_of(data: bytes) -> int | None:
    """The format version a file's first 10 bytes claim, if it has our magic."""
    if len(data) < 10 or data[:8] != MAGIC:
        return None
    version: int = struct.unpack_from("<H", data, 8)[0]
    return version


def decode(
    data: bytes,
    path: str,
    store: object | None = None,
    ref: CheckpointRef | None = None,
    schemas: SchemaLookup | None = None,
    opened: JsonStream | None = None,
) -> tuple[FileHeader, pa.Table]:
    """Verify and parse a checkpoint file (``opened``: a format 1 or 2 file's stream
    :func:`open_json_format` opened on ``data``, not read yet). Raises CheckpointFileCorrupt
    naming ``path``, or SchemaMismatch for a format 3 delta whose schema id ``schemas`` does
    not know."""
    corrupt = corrupt_reporter(path, store, ref)
    if format_of(data) == DELTA_FORMAT_VERSION:
        header, parsed, stored = parse_compact_rows(data, path, store, ref, schemas)
        table = decode_compact_rows(header, parsed.encodings, stored, corrupt)
    else:
        header, table = _decode_json_format(data, corrupt, opened)
    check_rows(header, table, corrupt)
    return header, table


def parse_compact_rows(
    data: bytes,
    path: str,
    store: object | None,
    ref: CheckpointRef | None,
    schemas: SchemaLookup | None,
) -> tuple[FileHeader, compact_format.Parsed, pa.Table]:
    """A format 3 delta's verified envelope, its header (with the schema its id names) and its
    rows as stored (narrow fields still narrow; every buffer validated): the part of
    :func:`decode` a chain's tiny deltas go through one by one before their rows are decoded
    together (:mod:`state_runtime.store.tiny_deltas`). Raises as :func:`decode` does."""
    corrupt = corrupt_reporter(path, store, ref)
    parsed = _parse_compact(data, corrupt)
    header = parsed.header
    schema = None if schemas is None or header.schema_id is None else schemas(header.schema_id)
    if schema is None:
        raise errors.SchemaMismatch(
            f"the file names schema {header.schema_id}, which neither this store's schema "
            "history nor the checkpoint root's schemas/ folder holds",
            store=store,
            path=path,
            version=None if ref is None else ref.version,
            checkpoint_id=None if ref is None else ref.checkpoint_id,
        )
    header = replace(header, schema=schema)
    try:
        stored = parsed.rows(schema.key_arrow, schema.value_arrow)
    except PARSE_ERRORS as e:
        raise corrupt(_unparsable(header, e)) from e
    return header, parsed, stored


def decode_compact_rows(
    header: FileHeader,
    encodings: dict[str, Any],
    stored: pa.Table,
    corrupt: Callable[[str], CheckpointFileCorrupt],
) -> pa.Table:
    """A format 3 delta's rows as stored (:func:`parse_compact_rows`) decoded."""
    assert header.schema is not None
    try:
        return decode_table(stored, encodings, header.schema.key_arrow, header.schema.value_arrow)
    except PARSE_ERRORS as e:
        raise corrupt(_unparsable(header, e)) from e


def _unparsable(header: FileHeader, e: Exception) -> str:
    assert header.schema is not None
    return f"rows do not parse under schema {header.schema_id} (<{header.schema.describe()}>): {e}"


def check_rows(
    header: FileHeader, table: pa.Table, corrupt: Callable[[str], CheckpointFileCorrupt]
) -> None:
    """Refuse decoded rows whose columns or count are not what the header says."""
    assert header.schema is not None
    problem = layout_problem(table, header.schema.key_arrow, header.schema.value_arrow)
    if problem:
        raise corrupt(problem)
    _check_row_count(table, header, corrupt)


def read_header(
    data: bytes, path: str, store: object | None = None, ref: CheckpointRef | None = None
) -> FileHeader:
    """Verify a checkpoint file's bytes and parse what it says about itself, without needing
    its schema: a format 3 delta's rows are not parsed (its ``schema`` is None), an older
    file is decoded whole. Raises CheckpointFileCorrupt naming ``path``."""
    if format_of(data) == DELTA_FORMAT_VERSION:
        return _parse_compact(data, corrupt_reporter(path, store, ref)).header
    return decode(data, path, store, ref)[0]


def read_header_as_parsed(
    data: bytes, path: str, store: object | None = None, ref: CheckpointRef | None = None
) -> tuple[FileHeader, pa.Table | None]:
    """:func:`read_header` for bytes whose rows were parsed whole before (the caller knows
    them to be those bytes: their checksum matched the one recorded for them): the envelope
    and checksum, the header and, for a format 1 or 2 file, its rows as stored (their columns
    and count checked against the header), not decoded again (the narrow integer columns'
    decoding is most of a small snapshot's cost). Raises CheckpointFileCorrupt naming
    ``path``."""
    if format_of(data) == DELTA_FORMAT_VERSION:
        return read_header(data, path, store, ref), None
    corrupt = corrupt_reporter(path, store, ref)
    stream, stored = _read_json_format(data, corrupt, None)
    problem = _columns_problem(stored)
    if problem:
        raise corrupt(problem)
    _check_row_count(stored, stream.header, corrupt)
    return stream.header, stored


def _check_row_count(
    table: pa.Table, header: FileHeader, corrupt: Callable[[str], CheckpointFileCorrupt]
) -> None:
    """Refuse rows of another count than the header's."""
    if table.num_rows != header.file_rows:
        raise corrupt(f"has {table.num_rows} rows, its header says {header.file_rows}")


PARSE_ERRORS = (
    RecursionError,  # deeply nested JSON in a crafted header or encodings
    OverflowError,  # a crafted timestamp out of range
    pa.ArrowException,
    OSError,
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    IndexError,
)


def corrupt_reporter(
    path: str, store: object | None, ref: CheckpointRef | None
) -> Callable[[str], CheckpointFileCorrupt]:
    def corrupt(reason: str) -> CheckpointFileCorrupt:
        return CheckpointFileCorrupt(
            f"corrupt checkpoint file: {reason}",
            store=store,
            path=path,
            version=None if ref is None else ref.version,
            checkpoint_id=None if ref is None else ref.checkpoint_id,
        )

    return corrupt


def _parse_compact(
    data: bytes, corrupt: Callable[[str], CheckpointFileCorrupt]
) -> compact_format.Parsed:
    problem = compact_format.check_envelope(data)
    if problem:
        raise corrupt(problem)
    try:
        return compact_format.Parsed(data)
    except (*PARSE_ERRORS, InvalidArgument) as e:
        raise corrupt(f"unparsable header: {e}") from e


@dataclass(frozen=True)
class JsonStream:
    """A format 1 or 2 file's Arrow stream opened and its header parsed, once: what deciding
    how to read a file read whole (by its rows) and decoding it both need. Its ``reader`` is
    read once."""

    reader: pa.ipc.RecordBatchStreamReader
    header: FileHeader
    encodings: bytes | None


def open_json_format(data: bytes, corrupt: Callable[[str], CheckpointFileCorrupt]) -> JsonStream:
    """The stream and header of the format 1 or 2 file ``data`` (its checksum not checked)."""
    fmt, _, _ = envelope_of(data, corrupt)
    payload = memoryview(data)[ENVELOPE_SIZE:]
    try:
        options = pa.ipc.IpcReadOptions(use_threads=len(payload) >= THREADED_BYTES)
        reader = pa.ipc.open_stream(pa.py_buffer(payload), options=options)
        header, encodings = stream_header(reader.schema, fmt)
    except (*PARSE_ERRORS, InvalidArgument) as e:
        raise corrupt(f"unparsable content: {e}") from e
    return JsonStream(reader, header, encodings)


def _read_json_format(
    data: bytes, corrupt: Callable[[str], CheckpointFileCorrupt], opened: JsonStream | None
) -> tuple[JsonStream, pa.Table]:
    """A format 1 or 2 file (the 52-byte envelope and an Arrow IPC stream with a JSON header),
    its envelope and checksum checked: its stream and its rows as stored (columns encoded)."""
    _, length, digest = envelope_of(data, corrupt)
    payload = memoryview(data)[ENVELOPE_SIZE:]
    check_payload(len(payload), length, hashlib.sha256(payload).digest() == digest, corrupt)
    stream = opened or open_json_format(data, corrupt)
    try:
        return stream, stream.reader.read_all()
    except PARSE_ERRORS as e:
        raise corrupt(f"unparsable content: {e}") from e


def _decode_json_format(
    data: bytes, corrupt: Callable[[str], CheckpointFileCorrupt], opened: JsonStream | None
) -> tuple[FileHeader, pa.Table]:
    """Formats 1 and 2: :func:`_read_json_format`'s rows decoded."""
    stream, stored = _read_json_format(data, corrupt, opened)
    header = stream.header
    assert header.schema is not None
    try:
        key_type, value_type = header.schema.key_arrow, header.schema.value_arrow
        table = decode_table(stored, stream.encodings, key_type, value_type)
    except (*PARSE_ERRORS, InvalidArgument) as e:
        raise corrupt(f"unparsable content: {e}") from e
    return header, table


def envelope_of(
    data: bytes, corrupt: Callable[[str], CheckpointFileCorrupt]
) -> tuple[int, int, bytes]:
    """A format 1 or 2 file's envelope (its first :data:`ENVELOPE_SIZE` bytes, or all of a
    shorter file), checked: the format version, the payload's length and its SHA-256."""
    if len(data) < ENVELOPE_SIZE:
        raise corrupt(f"truncated: {len(data)} bytes, shorter than the {ENVELOPE_SIZE}-byte header")
    magic, fmt, reserved, length, digest = _ENVELOPE.unpack_from(data)
    if magic != MAGIC:
        raise corrupt(f"bad magic {magic!r}: not a state_runtime checkpoint file")
    if fmt not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise corrupt(f"unsupported format version {fmt} (this code reads {readable})")
    if reserved != 0:
        raise corrupt(f"reserved header field is {reserved}, expected 0")
    return fmt, length, digest


def check_payload(
    found: int, length: int, digest_matches: bool, corrupt: Callable[[str], CheckpointFileCorrupt]
) -> None:
    """Refuse a payload of another length than its envelope says, or another checksum."""
    if found != length:
        raise corrupt(f"truncated or extended: payload is {found} bytes, header says {length}")
    if not digest_matches:
        raise corrupt("checksum mismatch: the bytes were altered")


def stream_header(schema: pa.Schema, fmt: int) -> tuple[FileHeader, bytes | None]:
    """The header and the column encodings a format 1 or 2 stream's schema metadata holds.
    Raises ValueError when they are missing or malformed."""
    metadata = schema.metadata or {}
    raw = metadata.get(HEADER_KEY)
    if raw is None:
        raise ValueError("no state_runtime header in the Arrow schema metadata")
    header = FileHeader.from_json(raw, fmt)
    encodings = metadata.get(ENCODINGS_KEY)
    if encodings is not None and fmt < 2:
        raise ValueError(f"column encodings in a format version {fmt} file")
    return header, encodings


def layout_problem(table: pa.Table, key_type: pa.DataType, value_type: pa.DataType) -> str:
    """What is wrong with a decoded table's columns for its header's schemas, or ""."""
    problem = _columns_problem(table)
    if problem:
        return problem
    for name, expected in (("key", key_type), ("value", value_type)):
        found = table.schema.field(name).type
        if not pa.types.is_struct(found) or found != expected:
            return f"column {name!r} has type {found}, its header's schema says {expected}"
    if table.column("key").null_count:
        return "null keys"
    return ""


def _columns_problem(table: pa.Table) -> str:
    """What is wrong with a table's column names (decoded or as stored), or ""."""
    if table.column_names != ["key", "value"]:
        return f"columns {table.column_names}, expected exactly ['key', 'value']"
    return ""


def check_identity(
    header: FileHeader, store: StoreId, ref: CheckpointRef, kind: FileKind, path: str
) -> None:
    """Refuse a file whose header names another store, version, id or kind than its name."""
    if not labelled(header, store, ref, kind):
        raise UnexpectedVersion(
            f"mislabelled checkpoint file: its header says store {header.store}, version "
            f"{header.version}, id {header.checkpoint_id}, kind {header.kind.value}",
            store=store,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            path=path,
        )


def labelled(header: FileHeader, store: StoreId, ref: CheckpointRef, kind: FileKind) -> bool:
    """Whether ``header`` names the store, version, id and kind of the file's name."""
    found = (header.store, header.version, header.checkpoint_id, header.kind)
    return found == (store, ref.version, ref.checkpoint_id, kind)
