"""What maintenance does and how far it may go: thresholds, retention and the safety floor."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from state_runtime.durations import format_duration, parse_duration
from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.identity import MAX_BIGINT, MAX_INT
from state_runtime.retention import RetentionPolicy

__all__ = [
    "ENV_PREFIX",
    "PRESETS",
    "SETTINGS",
    "MaintenancePolicy",
    "format_duration",
    "parse_duration",
    "parse_setting",
]

ENV_PREFIX = "STATE_MAINTENANCE_"


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

    def with_overrides(
        self, values: Mapping[str, object], labels: Mapping[str, str] | None = None
    ) -> MaintenancePolicy:
        """This policy with some settings replaced: ``values`` maps a setting (a field name, or
        ``retain_versions``, ``window``, ``orphan_grace`` of the retention) to its value.

        Each value is checked by the policy's own rules, one at a time, so that an error says
        which setting is wrong: it starts with ``labels[name]`` (how the user wrote it, e.g.
        ``--retain-versions 1`` or ``STATE_MAINTENANCE_WINDOW='soon'``) and keeps its type
        (InvalidArgument, or MaintenanceRefused below the safety floor).
        """
        labels = labels or {}
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise InvalidArgument(f"unknown maintenance setting(s): {', '.join(unknown)}")
        policy = self
        for name, value in values.items():
            change: dict[str, Any] = {name: value}
            try:
                if name in _RETENTION_SETTINGS:
                    policy = replace(policy, retention=replace(policy.retention, **change))
                else:
                    policy = replace(policy, **change)
            except StateStoreError as exc:
                raise type(exc)(f"{labels.get(name, name)}: {exc.reason}") from None
        return policy

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, preset: str = "default"
    ) -> MaintenancePolicy:
        """The ``preset`` policy (see PRESETS) with overrides from ``STATE_MAINTENANCE_*``
        variables (see docs).

        An unknown ``STATE_MAINTENANCE_*`` name (a typo would silently keep a default) and a
        value that does not parse are refused with InvalidArgument naming the variable; a
        value below the safety floor with MaintenanceRefused naming it.
        """
        env = os.environ if environ is None else environ
        known = {ENV_PREFIX + name.upper(): name for name in SETTINGS}
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)
        if unknown:
            raise InvalidArgument(
                f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values: dict[str, object] = {}
        labels: dict[str, str] = {}
        for variable, name in known.items():
            raw = env.get(variable, "").strip()
            if raw:
                labels[name] = f"{variable}={raw!r}"
                values[name] = parse_setting(name, raw, labels[name])
        if preset not in PRESETS:
            raise InvalidArgument(f"unknown policy {preset!r}; known: {', '.join(PRESETS)}")
        return PRESETS[preset].with_overrides(values, labels)


PRESETS: dict[str, MaintenancePolicy] = {
    "default": MaintenancePolicy(),
    # For a finished demo or test stream only: no window, so cleanup has something to show at
    # once. Never for a running stream: a file that young may belong to a batch in flight.
    "demo": MaintenancePolicy(
        snapshot_min_deltas=2,
        retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0)),
        min_window=timedelta(0),
    ),
}
"""Named policies (``statestore --policy NAME``)."""

_RETENTION_SETTINGS = ("retain_versions", "window", "orphan_grace")
SETTINGS: dict[str, type] = {
    "snapshot_min_deltas": int,
    "snapshot_max_recovery_bytes": int,
    "retain_versions": int,
    "window": timedelta,
    "orphan_grace": timedelta,
    "min_window": timedelta,
    "lease_ttl": timedelta,
    "lag_warn_deltas": int,
    "lag_error_deltas": int,
    "orphan_growth_warn_files": int,
    "overdue_after": timedelta,
}
"""Every maintenance setting and the type of its value."""


def parse_setting(name: str, raw: str, label: str) -> object:
    """The value of setting ``name`` written as text; InvalidArgument naming ``label``."""
    if SETTINGS[name] is timedelta:
        try:
            return parse_duration(raw)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{label}: {exc.reason}") from None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{label} is not an integer") from None
    largest = MAX_BIGINT if name.endswith("_bytes") else MAX_INT
    if not 0 <= value <= largest:
        raise InvalidArgument(f"{label} is out of range (0 to {largest})")
    return value
