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
    """State on local disk (docs/state-on-disk.md), as of the commit. ``resident_bytes``: what
    this store's committed version holds in memory (its in-memory runs and the fence indexes
    of its runs on disk; the process's block cache is not in it); ``local_disk_bytes``: the
    sizes of its runs' files on local disk. The counters count this process while the store
    was open: ``block_cache_hits``/``_misses`` (block reads of lookups) and
    ``compaction_bytes`` (bytes merges wrote to local disk)."""

    resident_bytes: int = 0
    local_disk_bytes: int = 0
    block_cache_hits: int = 0
    block_cache_misses: int = 0
    compaction_bytes: int = 0
