"""The maintenance resource: the state catalog, the checkpoint storage and the policy, in one.

Every asset, check and sensor opens its work with :meth:`MaintenanceResource.run` (or
:meth:`~MaintenanceResource.fleet`), so that each body is a few lines; an error of ours raised
in either (Spark's wrappers included) fails the step as a :class:`dagster.Failure` whose
description is the one paragraph ``statestore`` prints, the full trace in the library's log
file (:mod:`state_runtime.failures`). Everything defaults to
what ``make demo`` produces, and the platform's environment applies when set, read when a run
starts (never when the code location loads): ``STATE_CATALOG_URL``, ``STATE_CHECKPOINT_ROOT``
and ``STATE_MAINTENANCE_*``. The policy fields are derived from the settings' declaration
(:data:`state_runtime.settings.MAINTENANCE`): unset, the variable or the built-in default
applies; set, the field overrides it (durations as ``"15m"``, ``"1h"``, ``"2d"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import AssetCheckExecutionContext, AssetExecutionContext, ConfigurableResource, Failure
from pydantic import Field, create_model

from state_runtime.catalog import Catalog, catalog_url
from state_runtime.failures import reported
from state_runtime.maintenance import (
    CallbackProgress,
    Fleet,
    MaintenancePolicy,
    Progress,
    StoreNames,
    canonical_root,
)
from state_runtime.maintenance.spread import Spread
from state_runtime.settings import MAINTENANCE, Setting
from state_runtime.storage import open_storage

ROOT_ENV = "STATE_CHECKPOINT_ROOT"


def _policy_field(setting: Setting) -> tuple[Any, Any]:
    """A resource field for a maintenance setting: unset by default, text for a duration."""
    kind = str if setting.kind == "duration" else int
    about = f"{setting.help} Unset: ${setting.env}, else {setting.text(setting.default)}."
    return (kind | None, Field(default=None, description=about))


_PolicyFields = create_model(  # type: ignore[call-overload]
    "_PolicyFields",
    __base__=ConfigurableResource,
    __module__=__name__,
    **{setting.name: _policy_field(setting) for setting in MAINTENANCE},
)


@contextmanager
def shown_as_paragraph() -> Iterator[None]:
    """Our error, raised inside, as a Failure whose description is its one paragraph and the
    log file holding its trace (no trace in the step's or the daemon's output)."""
    try:
        yield
    except Failure:
        raise
    except Exception as exc:
        found = reported(exc)
        if found is None:
            raise
        error, paragraph = found
        raise Failure(description=paragraph, metadata={"code": error.code}) from None


@dataclass(frozen=True)
class MaintenanceRun:
    """What one Dagster run maintains with: the stores, the policy (how many stores it works
    on in parallel among it: ``workers``), progress as log lines."""

    fleet: Fleet
    policy: MaintenancePolicy
    progress: Progress
    names: StoreNames
    """The stores' readable names (their Dagster partition keys), read when the run starts."""
    spread: Spread | None = None
    """Where the passes' per-store work runs (Spark tasks with ``on_spark``), or None: in
    the run's own process, ``workers`` at once."""


class MaintenanceResource(_PolicyFields):  # type: ignore[misc,valid-type]
    """Where the state catalog (not Dagster's own storage) and the checkpoints are, and the
    maintenance policy. Leave ``catalog_url`` unset (or use ``EnvVar``) when the URL holds a
    password: Dagster shows a resource's configured values in its UI."""

    catalog_url: str | None = Field(
        default=None, description="The state catalog. Unset: $STATE_CATALOG_URL, else the demo's."
    )
    root: str | None = Field(
        default=None,
        description="Only this checkpoint root (path or URI). Unset: $STATE_CHECKPOINT_ROOT, "
        "else every root in the catalog.",
    )
    on_spark: bool = Field(
        default=False,
        description="Run the snapshot, validation and cleanup passes' per-store work as "
        "Spark tasks (the run records and reports as usual; executors must reach the "
        "catalog and the storage).",
    )
    spark_master: str = Field(
        default="local[2]",
        description="Spark master of on_spark (SPARK_REMOTE, when set, makes the session a "
        "Spark Connect client).",
    )

    @classmethod
    def of(cls, policy: MaintenancePolicy, **fields: Any) -> MaintenanceResource:
        """A resource setting every policy field to ``policy``'s value (and ``fields``)."""
        settings = {s.name: _config_value(s, policy.value(s.name)) for s in MAINTENANCE}
        return cls(**settings, **fields)

    def resolved_url(self) -> str:
        return self.catalog_url or catalog_url()

    def roots(self) -> list[str] | None:
        root = self.root or os.environ.get(ROOT_ENV, "").strip()
        return [canonical_root(root)] if root else None

    def policy(self) -> MaintenancePolicy:
        """The environment's policy with this resource's fields over it; an invalid field
        raises the library's error naming it (MaintenanceRefused below the safety floor)."""
        fields = {setting.name: getattr(self, setting.name) for setting in MAINTENANCE}
        return MaintenancePolicy.from_env().with_settings(fields, "maintenance resource")

    def spread(self) -> Spread | None:
        """Spark tasks for the passes' per-store work with ``on_spark`` (the session
        started on ``spark_master``), else None."""
        if not self.on_spark:
            return None
        from state_runtime.maintenance.spark import SparkSpread
        from state_runtime.runtime.spark_session import spark_session

        spark = spark_session(self.spark_master, app_name="dagster-maintenance")
        return SparkSpread(spark, self.resolved_url())

    @contextmanager
    def catalog(self) -> Iterator[Catalog]:
        catalog = Catalog.open(self.resolved_url())
        try:
            yield catalog
        finally:
            catalog.close()

    @contextmanager
    def fleet(self, owner: str) -> Iterator[Fleet]:
        """The stores to maintain (``owner`` names the work in leases and run records)."""
        with shown_as_paragraph(), self.catalog() as catalog:
            yield Fleet(catalog, roots=self.roots(), open_storage=open_storage, owner=owner)

    @contextmanager
    def run(
        self, context: AssetExecutionContext | AssetCheckExecutionContext
    ) -> Iterator[MaintenanceRun]:
        """One run's stores and policy (the policy first: a bad setting opens nothing)."""
        with shown_as_paragraph():
            policy = self.policy()
        log = context.log
        progress = CallbackProgress(lambda what, done, total: log.info(f"{what}: {done}/{total}"))
        with self.fleet(f"dagster:{context.run.run_id}") as fleet:
            names = StoreNames.of(fleet.catalog)
            yield MaintenanceRun(fleet, policy, progress, names, self.spread())


def _config_value(setting: Setting, value: int | timedelta | None) -> int | str | None:
    """A policy value as the resource's field holds it (durations as text)."""
    if value is None or isinstance(value, int):
        return value
    return setting.text(value)
