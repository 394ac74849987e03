"""Every tunable, declared once: name, kind, default, floor, help and environment variable.

The environment reader (:meth:`SettingGroup.read_env`), the ``statestore`` options
(``state_runtime/cli``) and the Dagster maintenance resource's fields
(``dagster_project/defs/resources.py``) are all derived from these declarations: adding a
setting is one :class:`Setting` here plus its use. Values are read when used, never at import:
the maintenance policy when a command or a Dagster run starts, the worker settings on the
driver when a batch starts (then shipped to the tasks with the batch).

Groups: :data:`MAINTENANCE` (``STATE_MAINTENANCE_*``, the :class:`MaintenancePolicy
<state_runtime.maintenance.MaintenancePolicy>`), :data:`CATALOG_TIMEOUTS`
(``STATE_CATALOG_*_TIMEOUT``, :class:`CatalogTimeouts
<state_runtime.catalog.CatalogTimeouts>`) and :data:`WORKER` (the executors' cache budget and
the coordinator's unload lag, :class:`WorkerSettings`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Literal, TypeVar

from state_runtime.durations import format_duration, parse_duration
from state_runtime.errors import InvalidArgument, MaintenanceRefused, StateStoreError
from state_runtime.identity import MAX_BIGINT, MAX_INT

__all__ = [
    "CATALOG_TIMEOUTS",
    "MAINTENANCE",
    "MIN_RETAINED_VERSIONS",
    "WORKER",
    "Setting",
    "SettingGroup",
    "Value",
    "WorkerSettings",
    "default_of",
    "parse_size",
]

Kind = Literal["int", "bytes", "duration"]
"""``int``: a count; ``bytes``: a size (``512MiB``, ``2GiB`` accepted); ``duration``: ``15m``."""
Value = int | timedelta
_V = TypeVar("_V", int, timedelta)

CATALOG_PREFIX = "STATE_CATALOG_"
MIN_RETAINED_VERSIONS = 2
"""The safety floor: at least this many committed versions always stay loadable."""

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def default_of(group: SettingGroup, name: str, kind: type[_V]) -> _V:
    """The declared default of ``name``, typed (for dataclass fields built from a group)."""
    value = group[name].default
    if not isinstance(value, kind):
        raise TypeError(f"{name} has no {kind.__name__} default")
    return value


def parse_size(text: str, setting: str = "STATE_CACHE_BYTES") -> int:
    """``"512MiB"`` → bytes; a clear error naming ``setting`` otherwise."""
    match = _SIZE_RE.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise InvalidArgument(
            f"{setting}={text!r}: expected a size in bytes, e.g. 1073741824, 512MiB or 2GiB"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Setting:
    """One tunable. ``default`` ``None``: unset means off (an optional threshold).

    ``floor`` is the lowest value accepted; below it the value is refused with
    ``InvalidArgument``, or with ``MaintenanceRefused`` and the ``refusal`` text when the floor
    is a safety floor (keeping fewer versions would lose data). ``option`` is the
    ``statestore`` option overriding it, if any; ``env`` its environment variable.
    """

    name: str
    kind: Kind
    default: Value | None
    help: str
    floor: Value
    env: str = ""
    option: str | None = None
    refusal: str | None = None
    top: int | None = None
    """The highest count accepted (a percentage's 100); unset: what the catalog can record."""

    def parse(self, raw: str, label: str) -> Value:
        """The value written as text (as in the environment); InvalidArgument naming
        ``label`` when it does not parse or is out of range (the floor is :meth:`check`'s)."""
        if self.kind == "duration":
            try:
                return parse_duration(raw)
            except InvalidArgument as exc:
                raise InvalidArgument(f"{label}: {exc.reason}") from None
        if self.kind == "bytes" and not raw.strip().isdigit():
            return parse_size(raw, label)
        try:
            value = int(raw)
        except ValueError:
            raise InvalidArgument(f"{label} is not an integer") from None
        if not 0 <= value <= self.ceiling:
            raise InvalidArgument(f"{label} is out of range (0 to {self.ceiling})")
        return value

    @property
    def ceiling(self) -> int:
        """The largest count accepted: ``top``, else what the catalog can record (sizes are
        BIGINT, counts INT)."""
        if self.top is not None:
            return self.top
        return MAX_BIGINT if self.kind == "bytes" else MAX_INT

    def check(self, value: Value | None) -> None:
        """Refuse a value of the wrong type or below the floor (``None``: only if required)."""
        if value is None and self.default is None:
            return
        expected = timedelta if self.kind == "duration" else int
        if isinstance(value, bool) or not isinstance(value, expected):
            raise InvalidArgument(f"{self.name} must be a {self.kind}, got {value!r}")
        if self.top is not None and isinstance(value, int) and value > self.top:
            raise InvalidArgument(
                f"{self.name} must be at most {self.ceiling}, got {self.text(value)}"
            )
        if value < self.floor:  # type: ignore[operator]
            if self.refusal is not None:
                raise MaintenanceRefused(
                    self.refusal.format(value=value, floor=self.floor),
                    setting=self.name,
                    value=value,
                    limit=self.floor,
                )
            raise InvalidArgument(
                f"{self.name} must be at least {self.text(self.floor)}, got {self.text(value)}"
            )

    def text(self, value: Value | None) -> str:
        """The value as a person writes it (``1h``, ``2147483648``); ``unset`` for None."""
        if value is None:
            return "unset"
        return format_duration(value) if isinstance(value, timedelta) else str(value)


@dataclass(frozen=True)
class SettingGroup:
    """Settings read together. ``prefix``: every variable starting with it is one of the
    group's (an unknown one is a typo that would silently keep a default, and is refused);
    each setting's variable defaults to ``prefix + NAME + suffix``."""

    settings: tuple[Setting, ...]
    prefix: str
    suffix: str = ""
    closed: bool = True
    by_name: dict[str, Setting] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        named = {
            s.name: s if s.env else replace(s, env=f"{self.prefix}{s.name.upper()}{self.suffix}")
            for s in self.settings
        }
        object.__setattr__(self, "settings", tuple(named.values()))
        object.__setattr__(self, "by_name", named)

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.settings)

    def __getitem__(self, name: str) -> Setting:
        return self.by_name[name]

    def read_env(
        self, environ: Mapping[str, str] | None = None
    ) -> tuple[dict[str, Value], dict[str, str]]:
        """The values set in the environment (read now), by setting name, and how each was
        written (``NAME='raw'``, for errors). InvalidArgument names the variable of a value
        that does not parse, and every unknown variable of a closed group's prefix."""
        env = os.environ if environ is None else environ
        if self.closed:
            known = {s.env for s in self.settings}
            unknown = sorted(k for k in env if k.startswith(self.prefix) and k not in known)
            if unknown:
                raise InvalidArgument(
                    f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
                )
        values: dict[str, Value] = {}
        labels: dict[str, str] = {}
        for setting in self.settings:
            raw = env.get(setting.env, "").strip()
            if raw:
                labels[setting.name] = f"{setting.env}={raw!r}"
                values[setting.name] = setting.parse(raw, labels[setting.name])
        return values, labels


MAINTENANCE = SettingGroup(
    (
        Setting(
            "snapshot_min_deltas",
            "int",
            10,
            "Deltas since the last snapshot that make one due.",
            floor=1,
            option="--min-deltas",
        ),
        Setting(
            "snapshot_max_recovery_bytes",
            "bytes",
            None,
            "Also due when a cold load reads this many bytes (unset: never).",
            floor=1,
        ),
        Setting(
            "snapshots_per_run",
            "int",
            None,
            "Snapshots one pass writes at most, costliest cold load first (unset: all due).",
            floor=1,
            option="--snapshots-per-run",
        ),
        Setting(
            "workers",
            "int",
            None,
            "Stores worked on in parallel (unset: as many as the host and the catalog's "
            "connection pool allow).",
            floor=1,
            option="--workers",
        ),
        Setting(
            "processes",
            "int",
            None,
            "Worker processes on this host the snapshot, validation and cleanup passes deal "
            "their stores to, each running --workers threads, on a PostgreSQL catalog (on "
            "SQLite, whose file has one writer, always threads). Unset: one per CPU for a "
            "pass of at least 250 items a process, else threads; 1: threads in this process, "
            "whose Python runs on one core (see docs/maintenance.md).",
            floor=1,
            option="--processes",
        ),
        Setting(
            "verify_sample_percent",
            "int",
            5,
            "Percent of already verified files a validation reads again, the longest unread "
            "first (at 5, each is read again every 20 runs on average, so bit rot is "
            "found); new and changed files are always read, the others checked present with "
            "their size. "
            "100: every file (--full).",
            floor=0,
            top=100,
            option="--verify-sample-percent",
        ),
        Setting(
            "retain_versions",
            "int",
            MIN_RETAINED_VERSIONS,
            f"Committed versions kept loadable (>={MIN_RETAINED_VERSIONS}).",
            floor=MIN_RETAINED_VERSIONS,
            option="--retain-versions",
            refusal="retaining {value} version(s) is below the safety floor of {floor}: at "
            "least {floor} committed versions must stay loadable",
        ),
        Setting(
            "window",
            "duration",
            timedelta(hours=1),
            "Retention window: no committed file younger than this is deleted, e.g. 1h.",
            floor=timedelta(0),
            option="--window",
        ),
        Setting(
            "orphan_grace",
            "duration",
            timedelta(hours=1),
            "Age before uncommitted files go.",
            floor=timedelta(0),
            option="--orphan-grace",
        ),
        Setting(
            "min_window",
            "duration",
            timedelta(minutes=10),
            "Shortest window accepted.",
            floor=timedelta(0),
            option="--min-window",
        ),
        Setting(
            "lease_ttl",
            "duration",
            timedelta(minutes=10),
            "How long a crashed run may hold a store.",
            floor=timedelta(seconds=1),
        ),
        Setting("lag_warn_deltas", "int", 20, "Deltas since the last snapshot that warn.", floor=1),
        Setting(
            "lag_error_deltas", "int", 50, "Deltas since the last snapshot that fail.", floor=1
        ),
        Setting(
            "orphan_growth_warn_files",
            "int",
            100,
            "Orphan files added between validations that warn.",
            floor=0,
        ),
        Setting(
            "orphan_warn_files",
            "int",
            100,
            "Orphan files waiting for cleanup that degrade a store's status.",
            floor=1,
        ),
        Setting(
            "commit_lag_warn",
            "duration",
            timedelta(minutes=15),
            "A store with no commit for this long warns: its stream may have stopped writing.",
            floor=timedelta(seconds=1),
        ),
        Setting(
            "overdue_after",
            "duration",
            timedelta(days=2),
            "Deletable this long past the window: cleanup is behind.",
            floor=timedelta(0),
        ),
    ),
    prefix="STATE_MAINTENANCE_",
)
"""The maintenance policy: what maintenance does and how far it may go."""


def _timeout(name: str, seconds: int, about: str, env: str = "") -> Setting:
    return Setting(
        name, "duration", timedelta(seconds=seconds), about, floor=timedelta(seconds=1), env=env
    )


CATALOG_TIMEOUTS = SettingGroup(
    (
        _timeout("connect", 5, "Opening a connection (TCP, TLS, authentication)."),
        _timeout("statement", 30, "One SQL statement on the server."),
        _timeout("lock", 10, "Waiting for a row or table lock."),
        _timeout("attempt", 60, "One attempt of a call, first statement to COMMIT's answer."),
        _timeout("pool", 10, "Waiting for a free pooled connection."),
        _timeout("keepalive", 10, "TCP keepalive probe interval.", CATALOG_PREFIX + "KEEPALIVE"),
    ),
    prefix=CATALOG_PREFIX,
    suffix="_TIMEOUT",
    closed=False,  # STATE_CATALOG_URL shares the prefix
)
"""How long any catalog call may wait (see :class:`state_runtime.catalog.CatalogTimeouts`)."""

WORKER = SettingGroup(
    (
        Setting(
            "cache_bytes",
            "bytes",
            2 << 30,
            "Memory one Python worker gives to cached store versions, all stores together.",
            floor=0,
            env="STATE_CACHE_BYTES",
        ),
    ),
    prefix="STATE_WORKER_",
    closed=False,
)
"""Executor tunables, read on the driver and shipped to tasks (:class:`WorkerSettings`)."""


@dataclass(frozen=True)
class WorkerSettings:
    """The :data:`WORKER` settings as plain, picklable values a task carries."""

    cache_bytes: int = default_of(WORKER, "cache_bytes", int)

    def __post_init__(self) -> None:
        for setting in WORKER:
            setting.check(getattr(self, setting.name))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """The defaults with the environment's overrides, read now (on the driver)."""
        values, labels = WORKER.read_env(environ)
        try:
            return cls(**values)  # type: ignore[arg-type]
        except StateStoreError as exc:
            label = ", ".join(labels.values())
            raise exc.labelled(label) from None
