"""A snapshot of a version whose runs are on local disk, written without its state in memory.

The file is the one :func:`~state_runtime.store.writer.write_checkpoint` writes (format 2:
the 52-byte envelope, an Arrow IPC stream of record batches, the same header and column
encodings), built from the version's runs merged block by block, twice: a first pass gathers
what choosing the encodings needs (:class:`~state_runtime.store.column_encoding.TableEncoder`),
the second encodes the rows in batches of about
:data:`~state_runtime.store.checkpoint_format.BATCH_BYTES` into a file in the worker's local
folder. The SHA-256 of the payload is then computed from that file and written into its
envelope, and the file goes to storage a piece at a time
(:meth:`~state_runtime.storage.base.Storage.write_stream_if_absent`: on S3 a multipart
upload). Memory is a few blocks, a batch and the upload's parts in flight. Rows are in index
order, which is key order for one integer key column; other keys are in hash order (a whole
write sorts them by key): still format 2, read the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa

from state_runtime.errors import FileAlreadyExists
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.store.checkpoint_format import (
    BATCH_BYTES,
    ENVELOPE_SIZE,
    HEADER_KEY,
    checksum,
    envelope,
    now,
)
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.column_encoding import ENCODINGS_KEY, TableEncoder
from state_runtime.store.disk_runs import LOCAL_DISK, held_bytes, raise_if_full
from state_runtime.store.file_header import FileHeader
from state_runtime.store.sorted_runs import Run, concat
from state_runtime.store.versions import Version, layer_blocks
from state_runtime.store.writer import CheckpointTarget

_HASH_BYTES = 1 << 20


def write_snapshot_streamed(
    target: CheckpointTarget, ref: CheckpointRef, version: Version, *, exists_ok: bool
) -> CheckpointInfo:
    """Write ``<version>_<id>.snapshot`` of ``version`` (see the module); an existing file is
    left untouched and described as it is with ``exists_ok``, else FileAlreadyExists."""
    assert ref.checkpoint_id is not None
    started = time.perf_counter()
    path = target.store.file_path(ref.version, ref.checkpoint_id, FileKind.SNAPSHOT)
    header = FileHeader(
        FileKind.SNAPSHOT,
        target.store,
        ref.version,
        ref.checkpoint_id,
        version.lineage,
        target.schema,
        version.rows,
        version.rows,
        now(),
        target.history.newest.schema_id,
    )
    spool = os.path.join(LOCAL_DISK.directory, f"{uuid.uuid4().hex}.snapshot")
    try:
        try:
            digest = _spool(target, header, version, spool)
        except OSError as e:  # pyarrow's ENOSPC is an OSError too
            needed = sum(held_bytes(run) for run in version.runs)
            raise_if_full(e, "a snapshot", target.store, needed, spool)
            raise
        size = os.path.getsize(spool)
        try:
            with open(spool, "rb") as source:
                target.storage.write_stream_if_absent(path, source, size)
            found, written = digest.hex(), size
        except FileAlreadyExists:
            if not exists_ok:
                raise
            with target.storage.read_stream(path) as existing:
                found, written = checksum(existing.read(ENVELOPE_SIZE)), 0
    finally:
        if os.path.exists(spool):
            os.unlink(spool)
    return CheckpointInfo(
        store=target.store,
        version=ref.version,
        checkpoint_id=ref.checkpoint_id,
        base_checkpoint_id=version.lineage[0].checkpoint_id if version.lineage else None,
        lineage=version.lineage,
        kind=FileKind.SNAPSHOT,
        path=path,
        rows=version.rows,
        file_rows=version.rows,
        bytes_written=written,
        checksum=found,
        created_at=header.created_at,
        timings_ms={FileKind.SNAPSHOT.value: (time.perf_counter() - started) * 1000},
    )


def _spool(target: CheckpointTarget, header: FileHeader, version: Version, spool: str) -> bytes:
    """Write the file to ``spool`` (local), its envelope last; return the payload's digest."""
    schema = target.schema
    base, changes = version.layers()

    def batches() -> Iterator[Run]:
        """The rows in index order, gathered into batches of about BATCH_BYTES."""
        pending: list[Run] = []
        held = 0
        for block in layer_blocks(version.indexer, base, changes):
            pending.append(block)
            held += block.nbytes
            if held >= BATCH_BYTES:
                yield concat(pending, schema.key_arrow, schema.value_arrow)
                pending, held = [], 0
        if pending:
            yield concat(pending, schema.key_arrow, schema.value_arrow)

    encoder = TableEncoder(schema.key_arrow, schema.value_arrow, in_key_order=version.indexer.exact)
    for batch in batches():
        encoder.add(batch.keys, batch.values)
    encodings = encoder.choose()
    empty = Run.empty(schema.key_arrow, schema.value_arrow)
    metadata = {HEADER_KEY: header.to_json()}
    if encodings:
        metadata[ENCODINGS_KEY] = json.dumps(encodings, separators=(",", ":")).encode()
    arrow_schema = encoder.encode(empty.keys, empty.values).schema.with_metadata(metadata)
    compression = target.config.compression
    codec = (
        None if compression == "none" else pa.Codec(compression, target.config.compression_level)
    )
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.OSFile(spool, "wb") as sink:
        sink.write(bytes(ENVELOPE_SIZE))  # the envelope goes in once the payload is known
        with pa.ipc.new_stream(sink, arrow_schema, options=options) as writer:
            for batch in batches():
                table = encoder.encode(batch.keys, batch.values)
                writer.write_table(table.replace_schema_metadata(metadata))
    digest = hashlib.sha256()
    with open(spool, "r+b") as f:
        f.seek(ENVELOPE_SIZE)
        while piece := f.read(_HASH_BYTES):
            digest.update(piece)
        length = f.tell() - ENVELOPE_SIZE
        f.seek(0)
        f.write(envelope(length, digest.digest()))
    return digest.digest()
