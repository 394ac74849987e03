"""What a commit or snapshot produced: the record the driver and the catalog keep."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from state_runtime.identity import CheckpointRef, FileKind, StoreId

NO_FILE_CHECKSUM = hashlib.sha256(b"").hexdigest()
"""The checksum recorded for a version that changed nothing: it has no file (0 bytes)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint file written for a store version.

    ``lineage`` lists the ancestors newest first, from ``version - 1`` back to the presumed
    last snapshot (or version 1, when the chain reaches the empty version 0). ``path`` is
    relative to the checkpoint root. ``rows`` is the state's row count at ``version``;
    ``file_rows`` the rows in the file (changes for a delta, the whole state for a snapshot).
    A delta whose ``checkpoint_id`` is its ``base_checkpoint_id`` has no file (see
    :attr:`has_file`).
    """

    store: StoreId
    version: int
    checkpoint_id: str
    base_checkpoint_id: str | None
    lineage: tuple[CheckpointRef, ...]
    kind: FileKind
    path: str
    rows: int
    file_rows: int
    bytes_written: int
    checksum: str
    created_at: datetime
    timings_ms: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.version, self.checkpoint_id)

    @property
    def has_file(self) -> bool:
        """False for a version that changed nothing: it keeps its parent's checkpoint id and
        nothing is written (``path`` names a file that never exists; 0 bytes). The catalog
        records no file for it: its commit names its parent's checkpoint."""
        return self.kind is FileKind.SNAPSHOT or self.checkpoint_id != self.base_checkpoint_id

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (for shipping from Spark tasks to the driver)."""
        return {
            "operator_id": self.store.operator_id,
            "partition_id": self.store.partition_id,
            "store_name": self.store.store_name,
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "base_checkpoint_id": self.base_checkpoint_id,
            "lineage": [[r.version, r.checkpoint_id] for r in self.lineage],
            "kind": self.kind.value,
            "path": self.path,
            "rows": self.rows,
            "file_rows": self.file_rows,
            "bytes_written": self.bytes_written,
            "checksum": self.checksum,
            "created_at": self.created_at.isoformat(),
            "timings_ms": dict(self.timings_ms),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointInfo:
        return cls(
            store=StoreId(int(d["operator_id"]), int(d["partition_id"]), str(d["store_name"])),
            version=int(d["version"]),
            checkpoint_id=str(d["checkpoint_id"]),
            base_checkpoint_id=d["base_checkpoint_id"],
            lineage=tuple(CheckpointRef(int(v), i) for v, i in d["lineage"]),
            kind=FileKind(d["kind"]),
            path=str(d["path"]),
            rows=int(d["rows"]),
            file_rows=int(d["file_rows"]),
            bytes_written=int(d["bytes_written"]),
            checksum=str(d["checksum"]),
            created_at=datetime.fromisoformat(d["created_at"]),
            timings_ms={str(k): float(v) for k, v in d.get("timings_ms", {}).items()},
        )
