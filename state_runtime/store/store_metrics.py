"""Per-store metrics: what loading and committing a version cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class LoadSource(StrEnum):
    """Where a loaded version came from."""

    EMPTY = "empty"  # version 0
    CACHE = "cache"  # exact version already in memory
    ROLL_FORWARD = "roll_forward"  # a cached ancestor plus the deltas it missed
    FILES = "files"  # a snapshot (or version 0) plus deltas, from storage


@dataclass
class LoadMetrics:
    source: LoadSource = LoadSource.CACHE
    files_read: int = 0
    bytes_read: int = 0
    deltas_applied: int = 0
    load_ms: float = 0.0
    repairs: list[str] = field(default_factory=list)
    """Problems worked around while loading, e.g. a corrupt snapshot replaced by its deltas."""


@dataclass
class StoreMetrics:
    """Figures of one store instance: its load, its updates and its commit."""

    rows: int = 0
    updated_keys: int = 0
    removed_keys: int = 0
    bytes_written: int = 0
    commit_ms: float = 0.0
    load: LoadMetrics = field(default_factory=LoadMetrics)
    disk: DiskMetrics = field(default_factory=lambda: DiskMetrics())


@dataclass
class DiskMetrics:
    """State on local disk (docs/state-on-disk.md), as of the commit: ``resident_bytes`` and
    ``local_disk_bytes`` for the whole process (every store), ``block_cache_hits`` and
    ``compaction_bytes`` (bytes merges wrote to local disk) since the store was opened."""

    resident_bytes: int = 0
    local_disk_bytes: int = 0
    block_cache_hits: int = 0
    compaction_bytes: int = 0
