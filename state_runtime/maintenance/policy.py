"""What maintenance does and how far it may go: thresholds, retention and the safety floor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from state_runtime.durations import format_duration, parse_duration
from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.retention import RetentionPolicy
from state_runtime.settings import MAINTENANCE, default_of
from state_runtime.status import LIMITS

__all__ = [
    "PRESETS",
    "MaintenancePolicy",
    "format_duration",
    "parse_duration",
]

_RETENTION_SETTINGS = ("retain_versions", "window", "orphan_grace")


@dataclass(frozen=True)
class MaintenancePolicy:
    """Thresholds and limits shared by the CLI and Dagster; each field is declared (default,
    floor, help, variable) in :data:`state_runtime.settings.MAINTENANCE`.

    - snapshots: a store is due when ``snapshot_min_deltas`` committed deltas follow its last
      snapshot, or when loading its latest version reads ``snapshot_max_recovery_bytes`` or more;
      a pass writes at most ``snapshots_per_run`` (costliest cold load first).
    - cleanup: ``retention`` (versions kept, window, orphan grace); a window shorter than
      ``min_window`` is refused, as is keeping fewer than 2 versions.
    - ``workers``: stores worked on in parallel; unset, as many as the host and the
      catalog's pool allow (:func:`state_runtime.maintenance.workers.worker_count`).
    - ``processes``: worker processes on this host a pass deals its stores to; unset, one
      per CPU for a large pass on PostgreSQL, 1 threads
      (:func:`state_runtime.maintenance.host_processes.process_count`).
    - ``lease_ttl``: how long a crashed run may block a store.
    - snapshot lag: a chain of ``lag_warn_deltas`` deltas warns, ``lag_error_deltas`` fails.
    - orphans: growth by more than ``orphan_growth_warn_files`` files between validations warns
      (the ``orphan_growth`` check); ``orphan_warn_files`` or more orphan files waiting for
      cleanup degrade a store's status (:mod:`state_runtime.status`). One setting per rule.
    - ``overdue_after``: deletable files older than the window by this much mean cleanup is
      not keeping up (retention is out of policy).
    - ``commit_lag_warn``: a store with no commit for this long warns (its stream stopped?).
    - validation: reads the files never verified or not intact when last read, and
      ``verify_sample_percent`` percent of the others, the longest unread first (100: all, a
      full validation); the rest are only checked present with their recorded size.
    """

    snapshot_min_deltas: int = default_of(MAINTENANCE, "snapshot_min_deltas", int)
    snapshot_max_recovery_bytes: int | None = None
    snapshots_per_run: int | None = None
    workers: int | None = None
    processes: int | None = None
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    min_window: timedelta = default_of(MAINTENANCE, "min_window", timedelta)
    lease_ttl: timedelta = default_of(MAINTENANCE, "lease_ttl", timedelta)
    lag_warn_deltas: int = default_of(MAINTENANCE, "lag_warn_deltas", int)
    lag_error_deltas: int = default_of(MAINTENANCE, "lag_error_deltas", int)
    orphan_growth_warn_files: int = default_of(MAINTENANCE, "orphan_growth_warn_files", int)
    orphan_warn_files: int = default_of(MAINTENANCE, "orphan_warn_files", int)
    overdue_after: timedelta = default_of(MAINTENANCE, "overdue_after", timedelta)
    commit_lag_warn: timedelta = default_of(MAINTENANCE, "commit_lag_warn", timedelta)
    verify_sample_percent: int = default_of(MAINTENANCE, "verify_sample_percent", int)

    def __post_init__(self) -> None:
        for setting in MAINTENANCE:
            if setting.name not in _RETENTION_SETTINGS:
                setting.check(getattr(self, setting.name))
        if self.lag_warn_deltas > self.lag_error_deltas:
            raise InvalidArgument("snapshot lag thresholds need 1 <= warn <= error")

    def check_retention(self) -> None:
        """Refuse a retention window shorter than ``min_window`` with MaintenanceRefused (the
        floor of retained versions is RetentionPolicy's own: it cannot be built below it)."""
        retention = self.retention
        if retention.window < self.min_window:
            raise MaintenanceRefused(
                f"retention window {format_duration(retention.window)} is shorter than the "
                f"configured minimum of {format_duration(self.min_window)}: files that young may "
                "belong to a batch still in flight. Use a longer window or lower min_window "
                f"({MAINTENANCE['min_window'].env}) deliberately.",
                setting="window",
                value=retention.window,
                limit=self.min_window,
            )

    def value(self, name: str) -> int | timedelta | None:
        """The value of setting ``name`` (a field, or one of the retention's)."""
        value: int | timedelta | None = getattr(
            self.retention if name in _RETENTION_SETTINGS else self, name
        )
        return value

    def status_limits(self) -> dict[str, int]:
        """The limits the status rule compares with (:data:`state_runtime.status.LIMITS`)."""
        return {name: getattr(self, name) for name in LIMITS}

    def parameters(self) -> dict[str, object]:
        """A JSON-able description, for run records and Dagster metadata."""
        return {
            "snapshot_min_deltas": self.snapshot_min_deltas,
            "snapshot_max_recovery_bytes": self.snapshot_max_recovery_bytes,
            "snapshots_per_run": self.snapshots_per_run,
            "retain_versions": self.retention.retain_versions,
            "window": format_duration(self.retention.window),
            "orphan_grace": format_duration(self.retention.orphan_grace),
            "min_window": format_duration(self.min_window),
            "verify_sample_percent": self.verify_sample_percent,
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
        unknown = sorted(set(values) - set(MAINTENANCE.by_name))
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
                raise exc.labelled(labels.get(name, name)) from None
        return policy

    def with_settings(self, raw: Mapping[str, object], source: str) -> MaintenancePolicy:
        """This policy with settings as an orchestrator's configuration gives them: by name,
        each a number or text (a duration as ``"15m"``, ``"2d"``), ``None`` for unset.

        Errors are :meth:`with_overrides`'s, naming ``source`` and the setting (e.g.
        ``maintenance resource window='soon'``); an unknown name is refused likewise.
        """
        values: dict[str, object] = {}
        labels: dict[str, str] = {}
        for name, value in raw.items():
            labels[name] = f"{source} {name}={value!r}"
            if value is not None and name in MAINTENANCE.by_name:
                values[name] = MAINTENANCE[name].parse(str(value), labels[name])
            elif value is not None:
                values[name] = value
        return self.with_overrides(values, labels)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, preset: str = "default"
    ) -> MaintenancePolicy:
        """The ``preset`` policy (see PRESETS) with overrides from ``STATE_MAINTENANCE_*``
        variables (see docs), read now.

        An unknown ``STATE_MAINTENANCE_*`` name (a typo would silently keep a default) and a
        value that does not parse are refused with InvalidArgument naming the variable; a
        value below the safety floor with MaintenanceRefused naming it.
        """
        if preset not in PRESETS:
            raise InvalidArgument(f"unknown policy {preset!r}; known: {', '.join(PRESETS)}")
        values, labels = MAINTENANCE.read_env(environ)
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
