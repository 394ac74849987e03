"""A large checkpoint file read a record batch at a time: a load that never holds it whole.

A format 2 snapshot or delta is a 52-byte envelope (payload length and SHA-256) and an Arrow
IPC stream in record batches of about
:data:`~state_runtime.store.checkpoint_format.BATCH_BYTES`. When its payload is large against
the spill threshold (:func:`streams`), the loader reads it from storage as a stream (the local
file, the S3 body; never a whole copy in memory), decodes it batch by batch under the store's
schema and hands the rows to a :class:`~state_runtime.store.run_builder.RunBuilder`, which
writes them to local disk as one sorted run once they outgrow the threshold (a delta's rows,
removals included, make a change run). The checksum is computed on the way and checked at the
end, with every other check of a whole read (envelope, layout, identity, row counts,
duplicate keys, no removals in a snapshot): a file that fails any of them discards what was
built, so nothing unverified is ever used, and a damaged file gets the same typed error as a
whole read gives.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

import pyarrow as pa

from state_runtime.errors import CheckpointFileCorrupt, InvalidArgument
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.storage.base import ByteStream
from state_runtime.store.checkpoint_format import (
    ENVELOPE_SIZE,
    PARSE_ERRORS,
    FileHeader,
    JsonStream,
    check_identity,
    check_payload,
    corrupt_reporter,
    envelope_of,
    format_of,
    layout_problem,
    open_json_format,
    stream_header,
)
from state_runtime.store.column_encoding import decode_table
from state_runtime.store.compact_format import COMPACT_FORMAT_VERSION
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_builder import RunBuilder
from state_runtime.store.run_levels import AnyRun
from state_runtime.store.schema_evolution import Projection

STREAM_RATIO = 8
"""A file is streamed when its payload times this passes the spill threshold: rows
decode to several times their stored bytes (zstd, narrow integers), so a smaller file may
still decode to more than the threshold."""

Projector = Callable[[FileHeader], Projection]
"""The projection from the schema a file's header says its rows were written under to the
store's schema (the one place a whole read widens rows too); raises SchemaMismatch when there
is none. The run is built in its target's types: rows written before a value column was
appended are widened before they reach it."""


def streams(head: bytes) -> bool:
    """Whether a file whose first :data:`ENVELOPE_SIZE` bytes are ``head`` is read as a
    stream: a format 1 or 2 envelope whose payload is large against the spill threshold (a
    format 3 delta holds at most one record batch of rows, under one CRC-32)."""
    if format_of(head) == COMPACT_FORMAT_VERSION:
        return False  # one body under one CRC-32: read whole (asked first: most files are)
    try:
        _, length, _ = envelope_of(head, corrupt_reporter("", None, None))
    except CheckpointFileCorrupt:
        return False  # the whole read names the problem
    return length * STREAM_RATIO > LOCAL_DISK.threshold()


def opened_whole(data: bytes) -> JsonStream | None:
    """A file read whole (``data``, not :func:`streams`) with its stream opened and header
    parsed, for :func:`decodes_large` and then the whole read (``decode``'s ``opened``): a
    format 1 or 2 file; None for a format 3 one (at most one record batch of rows) or one
    that does not parse (the whole read names the problem)."""
    if format_of(data) == COMPACT_FORMAT_VERSION:
        return None
    try:
        return open_json_format(data, corrupt_reporter("", None, None))
    except CheckpointFileCorrupt:
        return None


def decodes_large(opened: JsonStream | None) -> bool:
    """Whether a file read whole (:func:`opened_whole`) is still to be streamed: its header's
    rows, at its schema's row width, pass the spill threshold. Its stored size does not bound
    its rows: a count's first batch of 1.25M consecutive integer keys is a 7.5 KB delta
    decoding to 20 MiB, which a whole read held (and merged) in memory whatever the budget."""
    if opened is None:
        return False
    schema = opened.header.schema
    assert schema is not None
    return opened.header.file_rows * schema.row_bytes > LOCAL_DISK.threshold()


class _Payload(io.RawIOBase):
    """The payload after the envelope, read from ``stream``: hashed and counted on the way,
    never read past the length the envelope gives."""

    def __init__(self, stream: ByteStream, length: int) -> None:
        super().__init__()
        self._stream = stream
        self._left = length
        self.size = 0
        self.done = False
        self._hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        wanted = self._left if size < 0 else min(size, self._left)
        data = self._stream.read(wanted) if wanted else b""
        self._hash.update(data)
        self._left -= len(data)
        self.size += len(data)
        return data

    def finish(
        self, length: int, digest: bytes, corrupt: Callable[[str], CheckpointFileCorrupt]
    ) -> None:
        """Read what is left and check the length and the checksum."""
        self.done = True
        while self.read(1 << 20):
            pass
        extra = len(self._stream.read(1 << 16))  # bytes past the length: an extended file
        while extra and (more := len(self._stream.read(1 << 16))):
            extra += more
        check_payload(self.size + extra, length, self._hash.digest() == digest, corrupt)


def read_streamed(
    head: bytes,
    stream: ByteStream,
    *,
    kind: FileKind,
    path: str,
    store: StoreId,
    ref: CheckpointRef,
    indexer: KeyIndexer,
    project: Projector,
) -> tuple[FileHeader, AnyRun, int]:
    """The verified header and rows of the ``kind`` file ``head`` + ``stream`` (a snapshot,
    or a delta: its rows then a change run, removals included), and the file's size. Raises
    CheckpointFileCorrupt, UnexpectedVersion or SchemaMismatch as a whole read would."""
    corrupt = corrupt_reporter(path, store, ref)
    fmt, length, digest = envelope_of(head, corrupt)
    payload = _Payload(stream, length)
    builder: RunBuilder | None = None
    try:
        try:
            reader = pa.ipc.open_stream(pa.PythonFile(payload, mode="r"))
            header, encodings = stream_header(reader.schema, fmt)
        except (*PARSE_ERRORS, InvalidArgument) as e:
            raise corrupt(f"unparsable content: {e}") from e
        check_identity(header, store, ref, kind, path)
        schema = header.schema
        assert schema is not None
        projection = project(header)
        target = projection.target
        needed = length * STREAM_RATIO
        builder = RunBuilder(indexer, store, target.key_arrow, target.value_arrow, needed)
        carry: dict[str, int] = {}
        rows = 0
        batches = iter(reader)
        while True:
            try:
                batch = next(batches, None)
                table = pa.Table.from_batches([batch] if batch else [], reader.schema)
                table = decode_table(table, encodings, schema.key_arrow, schema.value_arrow, carry)
            except (*PARSE_ERRORS, InvalidArgument) as e:
                raise corrupt(f"unparsable content: {e}") from e
            problem = layout_problem(table, schema.key_arrow, schema.value_arrow)
            if problem:
                raise corrupt(problem)
            if batch is None:
                break
            keys, values = projection.apply(
                table.column("key").combine_chunks(), table.column("value").combine_chunks()
            )
            if values.null_count and kind is FileKind.SNAPSHOT:
                raise corrupt("a snapshot holds removals")
            rows += table.num_rows
            builder.add(keys, values)
        payload.finish(length, digest, corrupt)
        if rows != header.file_rows:
            raise corrupt(f"has {rows} rows, its header says {header.file_rows}")
        run = builder.finish()
        if builder.duplicates:
            raise corrupt(f"{builder.duplicates} duplicate keys")
    except BaseException:
        if builder is not None:
            builder.discard()
        if not payload.done:  # a damaged payload is the root cause of whatever failed
            payload.finish(length, digest, corrupt)
        raise
    return header, run, ENVELOPE_SIZE + payload.size
