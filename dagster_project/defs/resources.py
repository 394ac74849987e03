"""Resources: the state catalog, the checkpoint storage and the maintenance policy.

Each defaults to what ``make demo`` produces (the SQLite catalog in ``./demo-output``, every
root that catalog knows) and reads the platform's environment variables when set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from dagster import ConfigurableResource

from state_runtime.catalog import Catalog, RetentionPolicy, catalog_url
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    canonical_root,
    format_duration,
    parse_duration,
)
from state_runtime.storage import Storage, open_storage


class StateCatalogResource(ConfigurableResource):  # type: ignore[type-arg]
    """The state catalog (not Dagster's own storage). ``url`` unset: ``$STATE_CATALOG_URL``,
    else the demo's SQLite file. Leave ``url`` unset (or use ``EnvVar``) when the URL holds a
    password: Dagster shows a resource's configured values in its UI."""

    url: str | None = None

    def resolved_url(self) -> str:
        return self.url or catalog_url()

    @contextmanager
    def open(self) -> Iterator[Catalog]:
        catalog = Catalog.open(self.resolved_url())
        try:
            yield catalog
        finally:
            catalog.close()


class CheckpointStorageResource(ConfigurableResource):  # type: ignore[type-arg]
    """Where checkpoint files live. ``root`` narrows maintenance to one checkpoint root (a
    path or URI, as ``$STATE_CHECKPOINT_ROOT``); unset, every root in the catalog."""

    root: str | None = None

    def roots(self) -> list[str] | None:
        return None if not self.root else [canonical_root(self.root)]

    def open(self, root: str) -> Storage:
        return open_storage(root)


class MaintenancePolicyResource(ConfigurableResource):  # type: ignore[type-arg]
    """Thresholds and retention (durations as ``"15m"``, ``"1h"``, ``"2d"``)."""

    snapshot_min_deltas: int
    snapshot_max_recovery_bytes: int | None = None
    retain_versions: int
    window: str
    orphan_grace: str
    min_window: str
    lease_ttl: str
    lag_warn_deltas: int
    lag_error_deltas: int
    orphan_growth_warn_files: int
    overdue_after: str
    workers: int = 1

    @classmethod
    def of(cls, policy: MaintenancePolicy, workers: int = 1) -> MaintenancePolicyResource:
        def text(value: timedelta) -> str:
            return format_duration(value)

        return cls(
            snapshot_min_deltas=policy.snapshot_min_deltas,
            snapshot_max_recovery_bytes=policy.snapshot_max_recovery_bytes,
            retain_versions=policy.retention.retain_versions,
            window=text(policy.retention.window),
            orphan_grace=text(policy.retention.orphan_grace),
            min_window=text(policy.min_window),
            lease_ttl=text(policy.lease_ttl),
            lag_warn_deltas=policy.lag_warn_deltas,
            lag_error_deltas=policy.lag_error_deltas,
            orphan_growth_warn_files=policy.orphan_growth_warn_files,
            overdue_after=text(policy.overdue_after),
            workers=workers,
        )

    def policy(self) -> MaintenancePolicy:
        """The policy; MaintenanceRefused if it keeps fewer than 2 versions."""
        return MaintenancePolicy(
            snapshot_min_deltas=self.snapshot_min_deltas,
            snapshot_max_recovery_bytes=self.snapshot_max_recovery_bytes,
            retention=RetentionPolicy(
                retain_versions=self.retain_versions,
                window=parse_duration(self.window),
                orphan_grace=parse_duration(self.orphan_grace),
            ),
            min_window=parse_duration(self.min_window),
            lease_ttl=parse_duration(self.lease_ttl),
            lag_warn_deltas=self.lag_warn_deltas,
            lag_error_deltas=self.lag_error_deltas,
            orphan_growth_warn_files=self.orphan_growth_warn_files,
            overdue_after=parse_duration(self.overdue_after),
        )


@contextmanager
def open_fleet(
    catalog: StateCatalogResource, storage: CheckpointStorageResource, owner: str
) -> Iterator[Fleet]:
    """The stores to maintain, for one run (``owner`` names it in leases and run records)."""
    with catalog.open() as opened:
        yield Fleet(opened, roots=storage.roots(), open_storage=storage.open, owner=owner)
