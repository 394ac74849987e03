"""What maintenance does and how far it may go: thresholds, retention and the safety floor."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.retention import RetentionPolicy

_DURATION_RE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

ENV_PREFIX = "STATE_MAINTENANCE_"


def parse_duration(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"``, ``"1w"`` (a bare number is seconds)."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise InvalidArgument(f"invalid duration {text!r}: use a number with s, m, h, d or w")
    return timedelta(seconds=float(match["n"]) * _UNITS[match["unit"] or "s"])


def format_duration(value: timedelta) -> str:
    """The inverse of :func:`parse_duration`, in the largest exact unit."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class MaintenancePolicy:
    """Thresholds and limits shared by the CLI and Dagster.

    - snapshots: a store is due when ``snapshot_min_deltas`` committed deltas follow its last
      snapshot, or when loading its latest version reads ``snapshot_max_recovery_bytes`` or more.
    - cleanup: ``retention`` (versions kept, window, orphan grace); a window shorter than
      ``min_window`` is refused, as is keeping fewer than 2 versions.
    - ``lease_ttl``: how long a crashed run may block a store.
    - snapshot lag: a chain of ``lag_warn_deltas`` deltas warns, ``lag_error_deltas`` fails.
    - orphans: growth by more than ``orphan_growth_warn_files`` files between validations warns.
    - ``overdue_after``: deletable files older than the window by this much mean cleanup is
      not keeping up (retention is out of policy).
    """

    snapshot_min_deltas: int = 10
    snapshot_max_recovery_bytes: int | None = None
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    min_window: timedelta = timedelta(minutes=10)
    lease_ttl: timedelta = timedelta(minutes=10)
    lag_warn_deltas: int = 20
    lag_error_deltas: int = 50
    orphan_growth_warn_files: int = 100
    overdue_after: timedelta = timedelta(days=2)

    def __post_init__(self) -> None:
        if self.snapshot_min_deltas < 1:
            raise InvalidArgument("snapshot_min_deltas must be at least 1")
        if self.snapshot_max_recovery_bytes is not None and self.snapshot_max_recovery_bytes < 1:
            raise InvalidArgument("snapshot_max_recovery_bytes must be positive when set")
        if not 1 <= self.lag_warn_deltas <= self.lag_error_deltas:
            raise InvalidArgument("snapshot lag thresholds need 1 <= warn <= error")
        if self.lease_ttl <= timedelta(0) or self.min_window < timedelta(0):
            raise InvalidArgument("lease_ttl must be positive and min_window not negative")

    def check_retention(self) -> None:
        """Refuse a retention window shorter than ``min_window`` with MaintenanceRefused (the
        floor of retained versions is RetentionPolicy's own: it cannot be built below it)."""
        retention = self.retention
        if retention.window < self.min_window:
            raise MaintenanceRefused(
                f"retention window {format_duration(retention.window)} is shorter than the "
                f"configured minimum of {format_duration(self.min_window)}: files that young may "
                "belong to a batch still in flight. Use a longer window or lower min_window "
                f"({ENV_PREFIX}MIN_WINDOW) deliberately."
            )

    def parameters(self) -> dict[str, object]:
        """A JSON-able description, for run records and Dagster metadata."""
        return {
            "snapshot_min_deltas": self.snapshot_min_deltas,
            "snapshot_max_recovery_bytes": self.snapshot_max_recovery_bytes,
            "retain_versions": self.retention.retain_versions,
            "window": format_duration(self.retention.window),
            "orphan_grace": format_duration(self.retention.orphan_grace),
            "min_window": format_duration(self.min_window),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MaintenancePolicy:
        """The policy with overrides from ``STATE_MAINTENANCE_*`` variables (see docs)."""
        env = os.environ if environ is None else environ
        default = cls()

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        def optional_number(name: str) -> int | None:
            raw = get(name)
            try:
                return None if raw is None else int(raw)
            except ValueError:
                raise InvalidArgument(f"{ENV_PREFIX}{name}={raw!r} is not an integer") from None

        def number(name: str, fallback: int) -> int:
            found = optional_number(name)
            return fallback if found is None else found

        def duration(name: str, fallback: timedelta) -> timedelta:
            raw = get(name)
            return fallback if raw is None else parse_duration(raw)

        return cls(
            snapshot_min_deltas=number("SNAPSHOT_MIN_DELTAS", default.snapshot_min_deltas),
            snapshot_max_recovery_bytes=optional_number("SNAPSHOT_MAX_RECOVERY_BYTES"),
            retention=RetentionPolicy(
                retain_versions=number("RETAIN_VERSIONS", default.retention.retain_versions),
                window=duration("WINDOW", default.retention.window),
                orphan_grace=duration("ORPHAN_GRACE", default.retention.orphan_grace),
            ),
            min_window=duration("MIN_WINDOW", default.min_window),
            lease_ttl=duration("LEASE_TTL", default.lease_ttl),
            lag_warn_deltas=number("LAG_WARN_DELTAS", default.lag_warn_deltas),
            lag_error_deltas=number("LAG_ERROR_DELTAS", default.lag_error_deltas),
            orphan_growth_warn_files=number(
                "ORPHAN_GROWTH_WARN_FILES", default.orphan_growth_warn_files
            ),
            overdue_after=duration("OVERDUE_AFTER", default.overdue_after),
        )
