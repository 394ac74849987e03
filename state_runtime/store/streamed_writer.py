"""Checkpoint files too large to hold in memory, written through a file on local disk.

A snapshot of a version whose runs are on local disk, and a delta with more rows than one
record batch, are written here. The file is the one
:func:`~state_runtime.store.writer.write_checkpoint` writes in format 2 (the 52-byte envelope,
an Arrow IPC stream of record batches, the same header and column encodings), built from the
rows a piece at a time, twice: a first pass gathers what choosing the encodings needs
(:class:`~state_runtime.store.column_encoding.TableEncoder`), the second encodes the rows in
batches of about :data:`~state_runtime.store.checkpoint_format.BATCH_BYTES` into a file in the
worker's local folder. The SHA-256 of the payload is then computed from that file and written
into its envelope, and the file goes to storage a piece at a time
(:meth:`~state_runtime.storage.base.Storage.write_stream_if_absent`: on S3 a multipart
upload). Memory is a few blocks, a batch and the upload's parts in flight, besides the rows
themselves where they are in memory (a commit's change run). Rows are in index order, which
is key order for one integer key column; other keys are in hash order (a whole write sorts
them by key): still format 2, read the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from state_runtime.errors import FileAlreadyExists
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.store import checkpoint_format
from state_runtime.store.checkpoint_format import (
    ENVELOPE_SIZE,
    HEADER_KEY,
    checksum,
    envelope,
)
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.column_encoding import ENCODINGS_KEY, TableEncoder
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.file_header import FileHeader
from state_runtime.store.run_levels import AnyRun, held_bytes
from state_runtime.store.run_writer import raise_if_full
from state_runtime.store.schema_files import publish
from state_runtime.store.sorted_runs import Run, concat
from state_runtime.store.versions import Version, layer_blocks
from state_runtime.store.writer import CheckpointTarget, write_checkpoint, written_info

_HASH_BYTES = 1 << 20

Pieces = Callable[[], Iterable[Run]]
"""The rows to write, in index order, as often as called (once per pass)."""


def write_snapshot_streamed(
    target: CheckpointTarget, ref: CheckpointRef, version: Version, *, exists_ok: bool
) -> CheckpointInfo:
    """Write ``<version>_<id>.snapshot`` of ``version`` from its runs, block by block (see
    the module); an existing file is left untouched and described as it is with
    ``exists_ok``, else FileAlreadyExists."""
    base, changes = version.layers()
    return _write(
        target,
        FileKind.SNAPSHOT,
        ref,
        version.lineage,
        lambda: layer_blocks(version.indexer, base, changes),
        version.rows,
        version.rows,
        in_key_order=version.indexer.exact,
        needed=sum(held_bytes(run) for run in version.runs),
        exists_ok=exists_ok,
    )


def write_delta(
    target: CheckpointTarget,
    ref: CheckpointRef,
    lineage: tuple[CheckpointRef, ...],
    changes: AnyRun,
    state_rows: int,
    *,
    in_key_order: bool,
) -> CheckpointInfo:
    """Write ``<version>_<id>.delta`` of a commit's ``changes`` (never overwriting): encoded
    in memory when they fit one record batch (format 3 where it can), else through a local
    file (see the module), so that the encoded copies never sit whole beside the rows.
    Changes on local disk (a batch of many large ``apply_arrow`` calls) are read a block at
    a time."""
    small = len(changes) <= checkpoint_format.batch_rows(held_bytes(changes), len(changes))
    if not isinstance(changes, Run) and small:
        # A small change run on disk (a tiny budget): one batch, written as in memory.
        changes = concat(list(changes.blocks()), changes.key_type, changes.value_type)
    if isinstance(changes, Run):
        data_bytes = int(changes.keys.nbytes) + int(changes.values.nbytes)
        if len(changes) <= checkpoint_format.batch_rows(data_bytes, len(changes)):
            return write_checkpoint(
                target,
                FileKind.DELTA,
                ref,
                lineage,
                changes.keys,
                changes.values,
                state_rows,
                in_key_order=in_key_order,
            )
    publish(target.storage, target.history.newest)  # before any file names it
    return _write(
        target,
        FileKind.DELTA,
        ref,
        lineage,
        changes.blocks,
        len(changes),
        state_rows,
        in_key_order=in_key_order,
        needed=held_bytes(changes),
        exists_ok=False,
    )


def _write(
    target: CheckpointTarget,
    kind: FileKind,
    ref: CheckpointRef,
    lineage: tuple[CheckpointRef, ...],
    pieces: Pieces,
    file_rows: int,
    state_rows: int,
    *,
    in_key_order: bool,
    needed: int,
    exists_ok: bool,
) -> CheckpointInfo:
    """Write ``<version>_<id>.<kind>`` holding the rows of ``pieces`` through a local file;
    LocalDiskFull (naming ``needed`` bytes) when the local disk fills up, nothing written to
    storage."""
    assert ref.checkpoint_id is not None
    started = time.perf_counter()
    path = target.store.file_path(ref.version, ref.checkpoint_id, kind)
    header = target.header(kind, ref, lineage, file_rows, state_rows)
    spool = os.path.join(LOCAL_DISK.directory, f"{uuid.uuid4().hex}.{kind.value}")
    try:
        try:
            digest = _spool(target, header, pieces, spool, in_key_order=in_key_order)
        except OSError as e:  # pyarrow's ENOSPC is an OSError too
            raise_if_full(e, f"a {kind.value} of this store's state", target.store, needed, spool)
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
    return written_info(header, path, written, found, started)


def _spool(
    target: CheckpointTarget, header: FileHeader, pieces: Pieces, spool: str, *, in_key_order: bool
) -> bytes:
    """Write the file to ``spool`` (local), its envelope last; return the payload's digest."""
    schema = target.schema

    def batches() -> Iterator[Run]:
        """The rows in index order, gathered or cut into batches of about BATCH_BYTES."""
        pending: list[Run] = []
        held = 0
        batch_bytes = checkpoint_format.BATCH_BYTES
        for block in pieces():
            for piece in block.pieces(batch_bytes):
                pending.append(piece)
                held += piece.nbytes
                if held >= batch_bytes:
                    yield concat(pending, schema.key_arrow, schema.value_arrow)
                    pending, held = [], 0
        if pending:
            yield concat(pending, schema.key_arrow, schema.value_arrow)

    encoder = TableEncoder(schema.key_arrow, schema.value_arrow, in_key_order=in_key_order)
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
