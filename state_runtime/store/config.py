"""The tuning knobs of a store provider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from state_runtime.errors import InvalidArgument
from state_runtime.retention import check_retained_versions
from state_runtime.settings import MIN_RETAINED_VERSIONS

Compression = Literal["zstd", "lz4", "none"]


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a :class:`~state_runtime.store.provider.StateStoreProvider`.

    - ``min_versions_to_retain``: committed versions that must stay loadable (never below the
      floor of :mod:`state_runtime.retention`, 2).
    - ``min_deltas_for_snapshot``: deltas after which a snapshot is due; also where a writer
      presumes the last snapshot when it knows of none (lineage in files is cut there).
    - ``cached_versions``: at most this many committed versions kept in memory by each
      provider, if set. Either way all cached versions of a process share one memory budget,
      least recently used first (``STATE_CACHE_BYTES``, see :mod:`state_runtime.store.cache`).
    - ``compression`` and ``compression_level``: the Arrow IPC body codec of checkpoint files.
    - ``scan_prefix``: leading key fields that cluster the rows in memory (0: none): a
      ``prefix_scan`` of at least that many fields reads one range of each run, found by
      binary search, instead of passing over the state (see :mod:`state_runtime.store.keys`);
      files are the same either way.
    """

    min_versions_to_retain: int = MIN_RETAINED_VERSIONS
    min_deltas_for_snapshot: int = 10
    cached_versions: int | None = None
    compression: Compression = "zstd"
    compression_level: int | None = None
    scan_prefix: int = 0

    def __post_init__(self) -> None:
        check_retained_versions(
            self.min_versions_to_retain, "min_versions_to_retain", InvalidArgument, named=True
        )
        if self.min_deltas_for_snapshot < 1:
            raise InvalidArgument("min_deltas_for_snapshot must be >= 1")
        if self.cached_versions is not None and self.cached_versions < 1:
            raise InvalidArgument("cached_versions must be >= 1")
        if self.scan_prefix < 0:
            raise InvalidArgument("scan_prefix must be >= 0")
        if self.compression not in ("zstd", "lz4", "none"):
            raise InvalidArgument(f"unknown compression {self.compression!r}: zstd, lz4 or none")
