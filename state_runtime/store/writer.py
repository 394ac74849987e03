"""Writing one checkpoint file: its header, the encoded rows, put-if-absent, and its record.

Deltas (commits) and snapshots (maintenance) are written the same way; only what goes in
differs. The caller decides what a failure means (a commit turns it into ``CannotCommit``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from state_runtime.errors import FileAlreadyExists
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.storage import Storage
from state_runtime.store.checkpoint_format import FileHeader, checksum, encode, now
from state_runtime.store.checkpoint_info import NO_FILE_CHECKSUM, CheckpointInfo
from state_runtime.store.config import StoreConfig
from state_runtime.store.schema_files import fetch, publish
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema


@dataclass(frozen=True)
class CheckpointTarget:
    """Where a store's checkpoint files go and how they are encoded: files are written under
    the newest schema of ``history``, and name its id."""

    storage: Storage
    store: StoreId
    history: SchemaHistory
    config: StoreConfig

    @property
    def schema(self) -> StateSchema:
        return self.history.newest.schema

    def schema_of(self, schema_id: str) -> StateSchema | None:
        """The schema a file names by id: from the history, else as published on storage
        (:mod:`state_runtime.store.schema_files`)."""
        return self.history.schema_of(schema_id) or fetch(self.storage, schema_id)

    def header(
        self,
        kind: FileKind,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        file_rows: int,
        state_rows: int,
    ) -> FileHeader:
        """The header of a file written now under the newest schema."""
        assert ref.checkpoint_id is not None
        return FileHeader(
            kind,
            self.store,
            ref.version,
            ref.checkpoint_id,
            lineage,
            self.schema,
            file_rows,
            state_rows,
            now(),
            self.history.newest.schema_id,
        )


def write_checkpoint(
    target: CheckpointTarget,
    kind: FileKind,
    ref: CheckpointRef,
    lineage: tuple[CheckpointRef, ...],
    keys: pa.StructArray,
    values: pa.StructArray,
    state_rows: int,
    *,
    in_key_order: bool,
    exists_ok: bool = False,
) -> CheckpointInfo:
    """Write ``<version>_<id>.<kind>`` holding ``keys``/``values`` (never overwriting).

    With ``exists_ok`` an existing file is left untouched and described as it is (0 bytes
    written); otherwise FileAlreadyExists propagates. Encoding and storage errors propagate.
    """
    assert ref.checkpoint_id is not None
    started = time.perf_counter()
    path = target.store.file_path(ref.version, ref.checkpoint_id, kind)
    header = target.header(kind, ref, lineage, len(keys), state_rows)
    data = encode(
        header,
        keys,
        values,
        target.config.compression,
        target.config.compression_level,
        in_key_order=in_key_order,
    )
    if kind is FileKind.DELTA:
        publish(target.storage, target.history.newest)  # before any file names it
    try:
        target.storage.write_if_absent(path, data)
        written = len(data)
    except FileAlreadyExists:
        if not exists_ok:
            raise
        data = target.storage.read(path)
        written = 0
    return written_info(header, path, written, checksum(data), started)


def written_info(
    header: FileHeader, path: str, written: int, found: str, started: float
) -> CheckpointInfo:
    """What a writer reports of the file ``header`` heads at ``path``: ``written`` bytes (0
    when it was there already), its checksum ``found``, the time since ``started``
    (``time.perf_counter``)."""
    lineage = header.lineage
    return CheckpointInfo(
        store=header.store,
        version=header.version,
        checkpoint_id=header.checkpoint_id,
        base_checkpoint_id=lineage[0].checkpoint_id if lineage else None,
        lineage=lineage,
        kind=header.kind,
        path=path,
        rows=header.state_rows,
        file_rows=header.file_rows,
        bytes_written=written,
        checksum=found,
        created_at=header.created_at,
        timings_ms={header.kind.value: (time.perf_counter() - started) * 1000},
    )


def record_unchanged(
    target: CheckpointTarget,
    parent: CheckpointRef,
    lineage: tuple[CheckpointRef, ...],
    state_rows: int,
) -> CheckpointInfo:
    """The record of version ``parent.version + 1`` when a batch changed nothing: it keeps the
    parent's checkpoint id and writes no file (docs/checkpoint-format.md, "Versions without a
    file"). The id stays unambiguous: a commit that writes a file always takes a fresh one."""
    assert parent.checkpoint_id is not None and parent.version >= 1
    version = parent.version + 1
    return CheckpointInfo(
        store=target.store,
        version=version,
        checkpoint_id=parent.checkpoint_id,
        base_checkpoint_id=parent.checkpoint_id,
        lineage=lineage,
        kind=FileKind.DELTA,
        path=target.store.file_path(version, parent.checkpoint_id, FileKind.DELTA),
        rows=state_rows,
        file_rows=0,
        bytes_written=0,
        checksum=NO_FILE_CHECKSUM,
        created_at=now(),
    )
