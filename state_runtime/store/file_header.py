"""What a checkpoint file says about itself, whatever its format version.

Formats 1 and 2 hold it as JSON in the Arrow schema metadata (with the key and value schemas);
format 3 deltas as binary fields (:mod:`state_runtime.store.compact_format`) that name the
schema by id only and record the lineage's parent and depth rather than every ancestor.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.store.state_schema import StateSchema, schema_from_json

JSON_FORMAT_VERSION = 2
"""The format of files whose header is JSON in an Arrow IPC stream (snapshots)."""


@dataclass(frozen=True)
class FileHeader:
    """What a checkpoint file says about itself."""

    kind: FileKind
    store: StoreId
    version: int
    checkpoint_id: str
    lineage: tuple[CheckpointRef, ...]
    schema: StateSchema | None
    """The key and value schemas the rows were written with; None when only a format 3
    delta's header was read (it names its schema by ``schema_id``; decoding its rows resolves
    the id)."""
    file_rows: int
    state_rows: int
    created_at: datetime
    schema_id: str | None = None
    """The schema history entry the file was written under (None in files written before
    schema ids existed); see :mod:`state_runtime.store.schema_history`."""
    lineage_depth: int | None = None
    """How many ancestors the writer's lineage held (format 3 records only the first, the
    parent, in ``lineage``); None when ``lineage`` is complete."""
    format_version: int = JSON_FORMAT_VERSION

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)

    @property
    def depth(self) -> int:
        """The number of ancestors in the writer's lineage (the presumed snapshot's distance)."""
        return len(self.lineage) if self.lineage_depth is None else self.lineage_depth

    def to_json(self) -> bytes:
        assert self.schema is not None, "a JSON header carries its schemas"
        return json.dumps(
            {
                "format_version": JSON_FORMAT_VERSION,
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
    def from_json(cls, raw: bytes, format_version: int) -> FileHeader:
        d = json.loads(raw)
        if d.get("format_version") not in (1, JSON_FORMAT_VERSION):
            raise ValueError(f"unsupported header format_version {d.get('format_version')!r}")
        return cls(
            kind=FileKind(d["kind"]),
            store=StoreId(int(d["operator_id"]), int(d["partition_id"]), str(d["store_name"])),
            version=int(d["version"]),
            checkpoint_id=str(d["checkpoint_id"]),
            lineage=tuple(CheckpointRef(int(v), str(i)) for v, i in d["lineage"]),
            schema=_schema(json.dumps(d["key_schema"]), json.dumps(d["value_schema"])),
            file_rows=int(d["file_rows"]),
            state_rows=int(d["state_rows"]),
            created_at=datetime.fromisoformat(d["created_at"]),
            schema_id=None if d.get("schema_id") is None else str(d["schema_id"]),
            format_version=format_version,
        )


@functools.lru_cache(maxsize=256)
def _schema(key_json: str, value_json: str) -> StateSchema:
    """The schemas a JSON header holds, parsed once a process (with their Arrow types, cached
    on the one object): a fleet's snapshots share a few schemas, and parsing them was about a
    fifth of reading a small snapshot (its base in the snapshot pass, and the read back)."""
    return StateSchema(schema_from_json(key_json), schema_from_json(value_json))


def now() -> datetime:
    """The time a file is written, to the millisecond (what format 3 records)."""
    t = datetime.now(UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)
