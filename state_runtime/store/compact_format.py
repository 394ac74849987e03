"""Format 3: compact deltas that name their schema by id (docs/checkpoint-format.md).

At 200 partitions most deltas hold a few rows, and formats 1 and 2 spent about 1.2 KB on
every file (an envelope, a JSON header with both schemas and the full lineage, the Arrow
schema and batch flatbuffers). A format 3 delta spends under 100: a 14-byte envelope (magic,
format version, CRC-32 over every later byte), binary header fields (varints, ids as 16 raw
bytes), the schema as its 16-byte id in the store's schema history, the lineage as its parent
id and depth, and the rows as their Arrow buffers (:mod:`state_runtime.store.arrow_buffers`),
compressed when that is smaller. Integer fields are stored narrow as in format 2
(:mod:`state_runtime.store.column_encoding`).

This module turns headers and rows into bytes and back; :mod:`state_runtime.store.checkpoint_format`
chooses the format and resolves the schema id. Every reader error is a ValueError (or an
Arrow error) that the caller reports as a corrupt file naming it.
"""

from __future__ import annotations

import functools
import struct
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from state_runtime.identity import DEFAULT_STORE_NAME, CheckpointRef, FileKind, StoreId
from state_runtime.store.arrow_buffers import read_array, supported, write_array
from state_runtime.store.byte_fields import ByteReader, varint, zigzag
from state_runtime.store.config import Compression
from state_runtime.store.file_header import FileHeader

COMPACT_FORMAT_VERSION = 3
PREFIX = struct.Struct("<8sHI")  # magic, format version, CRC-32 of every later byte
_CODECS: tuple[Compression, ...] = ("none", "zstd", "lz4")
_KINDS = ("delta", "offset")
_WIDTHS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
COMPRESS_FROM = 256
"""Bodies shorter than this are stored raw: a codec's frame costs more than it saves."""
MAX_BODY = 2**31 - 1
"""The largest row body a reader decompresses (a crafted length must not exhaust memory)."""


def fits(table: pa.Table) -> bool:
    """Whether rows of this (stored) table can be written in format 3."""
    return all(supported(t) for t in table.schema.types)


def encode(
    magic: bytes,
    header: FileHeader,
    table: pa.Table,
    encodings: dict[str, Any],
    compression: Compression,
    level: int | None,
) -> bytes:
    """A format 3 file of ``header`` and ``table`` (``key``/``value``, integer fields already
    stored narrow as ``encodings`` says)."""
    assert header.schema_id is not None, "a format 3 file names its schema"
    body = bytearray()
    for name in ("key", "value"):
        write_array(table.column(name).combine_chunks(), body)
    codec = 0
    raw_size = len(body)
    if compression != "none" and raw_size >= COMPRESS_FROM:
        packed = pa.Codec(compression, level).compress(bytes(body), asbytes=True)
        if len(packed) + len(varint(raw_size)) < raw_size:
            codec, body = _CODECS.index(compression), bytearray(varint(raw_size) + packed)
    out = bytearray()
    out.append(int(header.kind is FileKind.SNAPSHOT) | codec << 1)
    name = header.store.store_name
    out += varint(header.store.operator_id) + varint(header.store.partition_id)
    out += varint(0) if name == DEFAULT_STORE_NAME else varint(len(name)) + name.encode()
    out += varint(header.version) + bytes.fromhex(header.checkpoint_id)
    out += varint(header.depth)
    if header.lineage:
        parent = header.lineage[0]
        assert parent.version == header.version - 1 and parent.checkpoint_id is not None
        out += bytes.fromhex(parent.checkpoint_id)
    out += bytes.fromhex(header.schema_id)
    out += varint(header.file_rows) + varint(header.state_rows)
    out += varint((header.created_at - _EPOCH) // _MILLISECOND)
    out += varint(len(encodings))
    for code, spec in encodings.items():
        column, index = code.split(".")
        stored = table.schema.field(column).type.field(int(index)).type
        out += varint(2 * int(index) + (column == "value"))
        out.append(_KINDS.index(spec["kind"]) | _WIDTHS.index(stored) << 1)
        out += zigzag(spec["base"])
    out += body
    rest = varint(len(out)) + out
    return PREFIX.pack(magic, COMPACT_FORMAT_VERSION, zlib.crc32(rest)) + rest


def check_envelope(data: bytes) -> str | None:
    """What is wrong with a format 3 file's envelope (length, CRC), or None."""
    if len(data) < PREFIX.size + 1:
        return f"truncated: {len(data)} bytes, shorter than the {PREFIX.size + 1}-byte minimum"
    reader = ByteReader(memoryview(data)[PREFIX.size :])
    try:
        length = reader.varint()
    except ValueError:
        return "truncated or corrupt: the length field is cut short"
    if reader.remaining != length:
        return (
            f"truncated or extended: {reader.remaining} bytes follow the header, it says {length}"
        )
    if zlib.crc32(memoryview(data)[PREFIX.size :]) != PREFIX.unpack_from(data)[2]:
        return "checksum mismatch: the bytes were altered"
    return None


class Parsed:
    """A format 3 file's header, its narrow encodings and its (decompressed) row body."""

    def __init__(self, data: bytes) -> None:
        reader = ByteReader(memoryview(data)[PREFIX.size :])
        reader.varint()  # the length, checked by check_envelope
        flags = reader.byte()
        if flags >> 3:
            raise ValueError(f"unknown flags {flags:#04x}")
        kind = FileKind.SNAPSHOT if flags & 1 else FileKind.DELTA
        codec = flags >> 1 & 3
        if codec >= len(_CODECS):
            raise ValueError(f"unknown body codec {codec}")
        operator_id, partition_id = reader.varint(), reader.varint()
        name_size = reader.varint()
        name = bytes(reader.take(name_size)).decode() if name_size else DEFAULT_STORE_NAME
        version = reader.varint()
        checkpoint_id = bytes(reader.take(16)).hex()
        depth = reader.varint()
        if (depth == 0) != (version == 1) or depth >= max(version, 1):
            raise ValueError(f"version {version} with a lineage of {depth} ancestors")
        lineage = (CheckpointRef(version - 1, bytes(reader.take(16)).hex()),) if depth else ()
        schema_id = bytes(reader.take(16)).hex()
        file_rows, state_rows = reader.varint(), reader.varint()
        created_at = _EPOCH + reader.varint() * _MILLISECOND
        self.encodings: dict[str, Any] = {}
        self.widths: dict[str, pa.DataType] = {}
        for _ in range(reader.varint()):
            code = reader.varint()
            where = f"{('key', 'value')[code & 1]}.{code >> 1}"
            kind_code = reader.byte()
            if kind_code >> 3 or where in self.encodings:
                raise ValueError(f"bad narrow encoding for {where}")
            self.encodings[where] = {"kind": _KINDS[kind_code & 1], "base": reader.zigzag()}
            self.widths[where] = _WIDTHS[kind_code >> 1]
        self.header = FileHeader(
            kind=kind,
            store=StoreId(operator_id, partition_id, name),
            version=version,
            checkpoint_id=checkpoint_id,
            lineage=lineage,
            schema=None,
            file_rows=file_rows,
            state_rows=state_rows,
            created_at=created_at,
            schema_id=schema_id,
            lineage_depth=depth,
            format_version=COMPACT_FORMAT_VERSION,
        )
        if codec:
            raw_size = reader.varint()
            if raw_size > MAX_BODY:
                raise ValueError(f"body of {raw_size} bytes, more than the {MAX_BODY} allowed")
            self.body = pa.Codec(_CODECS[codec]).decompress(
                bytes(reader.take(reader.remaining)), raw_size, asbytes=True
            )
            if len(self.body) != raw_size:
                raise ValueError(f"body decompresses to {len(self.body)} bytes, not {raw_size}")
        else:
            self.body = bytes(reader.take(reader.remaining))

    def rows(self, key_type: pa.StructType, value_type: pa.StructType) -> pa.Table:
        """The rows as stored (narrow integer fields still narrow), read under the schema's
        Arrow types; ValueError if the body does not fit them exactly."""
        reader = ByteReader(self.body)
        n = self.header.file_rows
        columns = {
            name: read_array(reader, _stored_type(name, t, self.widths), n)
            for name, t in (("key", key_type), ("value", value_type))
        }
        if reader.remaining:
            raise ValueError(f"{reader.remaining} bytes after the rows")
        return pa.table(columns)


def _stored_type(name: str, t: pa.StructType, widths: dict[str, pa.DataType]) -> pa.StructType:
    """The struct type of column ``name`` as stored: narrow fields in their stored width
    (:func:`state_runtime.store.column_encoding.decode_table` checks the rest)."""
    return _stored_type_of(name, t, tuple(widths.items()))


@functools.lru_cache(maxsize=1024)
def _stored_type_of(
    name: str, t: pa.StructType, widths: tuple[tuple[str, pa.DataType], ...]
) -> pa.StructType:
    """:func:`_stored_type`, kept by type and widths: a chain's deltas share a few (each
    built anew was a few Arrow calls a field, every file)."""
    fields = list(t)
    for where, stored in widths:
        column, index = where.split(".")
        if column != name:
            continue
        i = int(index)
        if i >= len(fields):
            raise ValueError(f"narrow encoding for {where}, which the schema does not have")
        fields[i] = fields[i].with_type(stored)
    return pa.struct(fields)
