"""Reading and writing checkpoint files (format version 1; see docs/checkpoint-format.md).

A file is a fixed 52-byte envelope (magic, format version, payload length, SHA-256 of the
payload) followed by an Arrow IPC stream. The stream's schema metadata holds a JSON header:
kind, store identity, version, checkpoint id, lineage, key/value schemas and row counts. Rows
are a ``key`` struct column and a ``value`` struct column; in a delta a null value removes
the key. Nothing is ever unpickled: parsing a file cannot execute code.
"""

from __future__ import annotations

import gc
import hashlib
import json
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.config import Compression
from state_runtime.errors import CheckpointFileCorrupt, UnexpectedVersion
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.schema import StateSchema, schema_from_json

MAGIC = b"STRTCKPT"
FORMAT_VERSION = 1
_ENVELOPE = struct.Struct("<8sHHQ32s")  # magic, format version, reserved, length, sha256
ENVELOPE_SIZE = _ENVELOPE.size
HEADER_KEY = b"state_runtime.header"

Key = tuple[Any, ...]
Value = tuple[Any, ...]


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
                "file_rows": self.file_rows,
                "state_rows": self.state_rows,
                "created_at": self.created_at.isoformat(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FileHeader:
        d = json.loads(raw)
        if d.get("format_version") != FORMAT_VERSION:
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
        )


def _columns(rows: Sequence[tuple[Any, ...]], arity: int) -> list[Sequence[Any]]:
    if not rows:
        return [[] for _ in range(arity)]
    return list(zip(*rows, strict=True))


def rows_to_table(
    keys: Sequence[Key], values: Sequence[Value | None], schema: StateSchema
) -> pa.Table:
    """Rows as a table with ``key`` and ``value`` struct columns; a None value is a null."""
    key_type, value_type = schema.key_arrow, schema.value_arrow
    key_children = [
        pa.array(col, type=key_type.field(i).type)
        for i, col in enumerate(_columns(keys, key_type.num_fields))
    ]
    removed = [v is None for v in values]
    filler = (None,) * value_type.num_fields
    value_children = [
        pa.array(col, type=value_type.field(i).type)
        for i, col in enumerate(
            _columns([filler if v is None else v for v in values], value_type.num_fields)
        )
    ]
    key_array = pa.StructArray.from_arrays(key_children, fields=list(key_type))
    value_array = pa.StructArray.from_arrays(
        value_children,
        fields=list(value_type),
        mask=pa.array(removed, type=pa.bool_()) if any(removed) else None,
    )
    return pa.table({"key": key_array, "value": value_array})


def encode(
    header: FileHeader,
    keys: Sequence[Key],
    values: Sequence[Value | None],
    compression: Compression = "zstd",
    compression_level: int | None = None,
) -> bytes:
    """Serialize rows (sorted by key where the key type allows) into a checkpoint file."""
    table = _sorted_by_key(rows_to_table(keys, values, header.schema))
    arrow_schema = table.schema.with_metadata({HEADER_KEY: header.to_json()})
    codec = None if compression == "none" else pa.Codec(compression, compression_level)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(
        sink, arrow_schema, options=pa.ipc.IpcWriteOptions(compression=codec)
    ) as writer:
        writer.write_table(table.replace_schema_metadata(arrow_schema.metadata))
    payload: bytes = sink.getvalue().to_pybytes()
    digest = hashlib.sha256(payload).digest()
    return _ENVELOPE.pack(MAGIC, FORMAT_VERSION, 0, len(payload), digest) + payload


def _sorted_by_key(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    key_children = table.column("key").combine_chunks().flatten()
    names = [f"k{i}" for i in range(len(key_children))]
    try:
        order = pc.sort_indices(
            pa.table(dict(zip(names, key_children, strict=True))),
            sort_keys=[(n, "ascending") for n in names],
        )
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return table  # key types without an order (maps): leave unsorted
    return table.take(order)


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
    if fmt != FORMAT_VERSION:
        raise corrupt(f"unsupported format version {fmt} (this code reads {FORMAT_VERSION})")
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
        raw = (reader.schema.metadata or {}).get(HEADER_KEY)
        if raw is None:
            raise ValueError("no state_runtime header in the Arrow schema metadata")
        header = FileHeader.from_json(raw)
    except (pa.ArrowException, ValueError, KeyError, TypeError) as e:
        raise corrupt(f"unparsable content: {e}") from e
    if table.num_rows != header.file_rows:
        raise corrupt(f"has {table.num_rows} rows, its header says {header.file_rows}")
    return header, table


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


def _to_python(array: pa.Array) -> list[Any]:
    """Column values shaped like what was put: structs as tuples, maps as dicts."""
    dtype = array.type
    if array.null_count == 0 and (
        pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)
    ):
        # Through numpy: about 20x faster than to_pylist for primitive columns.
        fast: list[Any] = array.to_numpy(zero_copy_only=False).tolist()
        return fast
    values = array.to_pylist(maps_as_pydicts="strict")
    fix = _tuple_converter(array.type)
    return values if fix is None else [fix(v) for v in values]


def _tuple_converter(dtype: pa.DataType) -> Any:
    """A function turning nested struct dicts into tuples, or None if ``dtype`` has no struct."""
    if pa.types.is_struct(dtype):
        children = [_tuple_converter(dtype.field(i).type) for i in range(dtype.num_fields)]
        names = [dtype.field(i).name for i in range(dtype.num_fields)]
        pairs = list(zip(names, children, strict=True))
        return lambda v: (
            None if v is None else tuple(v[n] if c is None else c(v[n]) for n, c in pairs)
        )
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        item = _tuple_converter(dtype.value_type)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if pa.types.is_map(dtype):
        k, i = _tuple_converter(dtype.key_type), _tuple_converter(dtype.item_type)
        if k is None and i is None:
            return None
        kf = k or (lambda x: x)
        vf = i or (lambda x: x)
        return lambda v: None if v is None else {kf(a): vf(b) for a, b in v.items()}
    return None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building millions of tuples (it would rescan them repeatedly)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rows_of(table: pa.Table, pad_values: int = 0) -> dict[Key, Value | None]:
    """The rows of a decoded table as a dict of Python tuples; a removed key maps to None.

    ``pad_values`` appends that many nulls to each value (a value schema that grew). A file
    with duplicate keys yields fewer entries than rows, which callers treat as corruption.
    """
    if not table.num_rows:
        return {}
    key = table.column("key").combine_chunks()
    value = table.column("value").combine_chunks()
    key_cols = [_to_python(key.field(i)) for i in range(key.type.num_fields)]
    value_cols = [_to_python(value.field(i)) for i in range(value.type.num_fields)]
    value_cols.extend([None] * table.num_rows for _ in range(pad_values))
    with gc_paused():
        values: Iterator[Value | None] = zip(*value_cols, strict=True)
        if value.null_count:
            valid = value.is_valid().to_numpy(zero_copy_only=False).tolist()
            values = (v if ok else None for v, ok in zip(values, valid, strict=True))
        return dict(zip(zip(*key_cols, strict=True), values, strict=True))


def now() -> datetime:
    return datetime.now(UTC)
