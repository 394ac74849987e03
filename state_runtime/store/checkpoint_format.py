"""Reading and writing checkpoint files (format version 2; see docs/checkpoint-format.md).

A file is a fixed 52-byte envelope (magic, format version, payload length, SHA-256 of the
payload) followed by an Arrow IPC stream. The stream's schema metadata holds a JSON header:
kind, store identity, version, checkpoint id, lineage, key/value schemas and row counts. Rows
are a ``key`` struct column and a ``value`` struct column; in a delta a null value removes
the key. Version 2 stores integer fields narrow (:mod:`state_runtime.store.column_encoding`);
version 1 files (every field as its schema says) are still read. Nothing is ever unpickled:
parsing a file cannot execute code.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.errors import CheckpointFileCorrupt, UnexpectedVersion
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.store.column_encoding import ENCODINGS_KEY, decode_table, encode_table
from state_runtime.store.config import Compression
from state_runtime.store.state_schema import StateSchema, schema_from_json

MAGIC = b"STRTCKPT"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
_ENVELOPE = struct.Struct("<8sHHQ32s")  # magic, format version, reserved, length, sha256
ENVELOPE_SIZE = _ENVELOPE.size
HEADER_KEY = b"state_runtime.header"


@dataclass(frozen=True)
class FileHeader:
    """What a checkpoint file says about itself."""

    kind: FileKind
    store: StoreId
    version: int
    checkpoint_id: str
    lineage: tuple[CheckpointRef, ...]
    schema: StateSchema
    file_rows: int
    state_rows: int
    created_at: datetime
    schema_id: str | None = None
    """The schema history entry the file was written under (None in files written before
    schema ids existed); see :mod:`state_runtime.store.schema_history`."""

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "kind": self.kind.value,
                "operator_id": self.store.operator_id,
                "partition_id": self.store.partition_id,
                "store_name": self.store.store_name,
                "version": self.version,
                "checkpoint_id": self.checkpoint_id,
                "lineage": [[r.version, r.checkpoint_id] for r in self.lineage],
                "key_schema": json.loads(self.schema.key.json()),
                "value_schema": json.loads(self.schema.value.json()),
                "schema_id": self.schema_id,
                "file_rows": self.file_rows,
                "state_rows": self.state_rows,
                "created_at": self.created_at.isoformat(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FileHeader:
        d = json.loads(raw)
        if d.get("format_version") not in READABLE_VERSIONS:
            raise ValueError(f"unsupported header format_version {d.get('format_version')!r}")
        return cls(
            kind=FileKind(d["kind"]),
            store=StoreId(int(d["operator_id"]), int(d["partition_id"]), str(d["store_name"])),
            version=int(d["version"]),
            checkpoint_id=str(d["checkpoint_id"]),
            lineage=tuple(CheckpointRef(int(v), str(i)) for v, i in d["lineage"]),
            schema=StateSchema(
                schema_from_json(json.dumps(d["key_schema"])),
                schema_from_json(json.dumps(d["value_schema"])),
            ),
            file_rows=int(d["file_rows"]),
            state_rows=int(d["state_rows"]),
            created_at=datetime.fromisoformat(d["created_at"]),
            schema_id=None if d.get("schema_id") is None else str(d["schema_id"]),
        )


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
    are already (or the key type has no order), integer fields stored narrow."""
    table = pa.table({"key": keys, "value": values})
    if not in_key_order:
        table, in_key_order = _sorted_by_key(table)
    table, encodings = encode_table(table, in_key_order=in_key_order)
    metadata = {HEADER_KEY: header.to_json()}
    if encodings:
        metadata[ENCODINGS_KEY] = json.dumps(encodings, separators=(",", ":")).encode()
    arrow_schema = table.schema.with_metadata(metadata)
    codec = None if compression == "none" else pa.Codec(compression, compression_level)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(
        sink, arrow_schema, options=pa.ipc.IpcWriteOptions(compression=codec)
    ) as writer:
        writer.write_table(table.replace_schema_metadata(arrow_schema.metadata))
    payload: bytes = sink.getvalue().to_pybytes()
    digest = hashlib.sha256(payload).digest()
    return _ENVELOPE.pack(MAGIC, FORMAT_VERSION, 0, len(payload), digest) + payload


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
    """The SHA-256 of a file's payload as hex: what the catalog records."""
    return data[20:ENVELOPE_SIZE].hex() if len(data) >= ENVELOPE_SIZE else ""


def decode(
    data: bytes, path: str, store: object | None = None, ref: CheckpointRef | None = None
) -> tuple[FileHeader, pa.Table]:
    """Verify and parse a checkpoint file. Raises CheckpointFileCorrupt naming ``path``."""

    def corrupt(reason: str) -> CheckpointFileCorrupt:
        return CheckpointFileCorrupt(
            f"corrupt checkpoint file: {reason}",
            store=store,
            path=path,
            version=None if ref is None else ref.version,
            checkpoint_id=None if ref is None else ref.checkpoint_id,
        )

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
    payload = memoryview(data)[ENVELOPE_SIZE:]
    if len(payload) != length:
        raise corrupt(
            f"truncated or extended: payload is {len(payload)} bytes, header says {length}"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise corrupt("checksum mismatch: the bytes were altered")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        table = reader.read_all()
        metadata = reader.schema.metadata or {}
        raw = metadata.get(HEADER_KEY)
        if raw is None:
            raise ValueError("no state_runtime header in the Arrow schema metadata")
        header = FileHeader.from_json(raw)
        key_type, value_type = header.schema.key_arrow, header.schema.value_arrow
        encodings = metadata.get(ENCODINGS_KEY)
        if encodings is not None and fmt < 2:
            raise ValueError(f"column encodings in a format version {fmt} file")
        table = decode_table(table, encodings, key_type, value_type)
    except (
        RecursionError,  # deeply nested JSON in a crafted header or encodings
        pa.ArrowException,
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
    ) as e:
        raise corrupt(f"unparsable content: {e}") from e
    problem = _layout_problem(table, key_type, value_type)
    if problem:
        raise corrupt(problem)
    if table.num_rows != header.file_rows:
        raise corrupt(f"has {table.num_rows} rows, its header says {header.file_rows}")
    return header, table


def _layout_problem(table: pa.Table, key_type: pa.DataType, value_type: pa.DataType) -> str:
    """What is wrong with a decoded table's columns for its header's schemas, or ""."""
    if table.column_names != ["key", "value"]:
        return f"columns {table.column_names}, expected exactly ['key', 'value']"
    for name, expected in (("key", key_type), ("value", value_type)):
        found = table.schema.field(name).type
        if not pa.types.is_struct(found) or found != expected:
            return f"column {name!r} has type {found}, its header's schema says {expected}"
    if table.column("key").null_count:
        return "null keys"
    return ""


def check_identity(
    header: FileHeader, store: StoreId, ref: CheckpointRef, kind: FileKind, path: str
) -> None:
    """Refuse a file whose header names another store, version, id or kind than its name."""
    expected = (store, ref.version, ref.checkpoint_id, kind)
    found = (header.store, header.version, header.checkpoint_id, header.kind)
    if expected != found:
        raise UnexpectedVersion(
            f"mislabelled checkpoint file: its header says store {header.store}, version "
            f"{header.version}, id {header.checkpoint_id}, kind {header.kind.value}",
            store=store,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            path=path,
        )


def now() -> datetime:
    return datetime.now(UTC)
