"""A "since" is the moment the status last changed (``store_status_changes``), and a restore is
not a validation: on real files and SQLite / PostgreSQL catalogs, through the maintenance
passes, ``health`` and the catalog's own SQL (``state_store_health``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import sqlalchemy as sa
from click.testing import CliRunner, Result

from state_runtime.catalog import Catalog, RunKind, StoreKey
from state_runtime.cli import main
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    StoreReport,
    plan_restore,
    restore_query,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime.status import NOT_RECORDED, Status, StoreStatus, store_status
from tests.maintenance.streams import StoreStream

POLICY = MaintenancePolicy(snapshot_min_deltas=3, lag_warn_deltas=3, lag_error_deltas=50)
"""A chain of 3 deltas after the last snapshot warns: a store is degraded after 3 batches."""
RESTORING = MaintenancePolicy()
"""Chains never warn in the restore journey: its statuses come from problems and validations."""
ONE = [StoreId(0, 0)]


def statestore(catalog: Catalog, *args: str) -> Result:
    url = catalog.engine.url.render_as_string(hide_password=False)
    runner = CliRunner(env={"COLUMNS": "250", "STATE_CATALOG_URL": None})
    return runner.invoke(main, ["--catalog-url", url, "-q", *args], catch_exceptions=False)


def report(fleet: Fleet, key: StoreKey, policy: MaintenancePolicy = POLICY) -> StoreReport:
    [found] = store_reports(fleet, policy, only=[key])
    return found


def last_run_ended(catalog: Catalog, kind: RunKind) -> datetime:
    run = next(r for r in catalog.recent_runs() if r.kind == kind.value)
    assert run.ended_at is not None
    return run.ended_at


def sql_since(catalog: Catalog, key: StoreKey) -> tuple[str, datetime | str, bool]:
    """The store's status, since and whether it is recorded, as the view shows them."""
    with catalog.engine.connect() as connection:
        row = connection.execute(
            sa.text(
                "SELECT status, status_since, status_recorded FROM state_store_health "
                "WHERE operator_id = :o AND partition_id = :p AND store_name = :n"
            ),
            {"o": key.store.operator_id, "p": key.store.partition_id, "n": key.store.store_name},
        ).one()
    return row[0], row[1], bool(row[2])


def same_moment(sql: datetime | str, python: datetime | None) -> bool:
    """SQLite's view gives a timestamp as its text; PostgreSQL's as an aware datetime."""
    assert python is not None
    if isinstance(sql, str):
        return sql == python.replace(tzinfo=None).isoformat(sep=" ")
    return sql == python


def test_a_snapshot_makes_a_degraded_store_healthy_since_the_snapshot_run(
    make_stream: Callable[..., StoreStream], fleet: Fleet
) -> None:
    """Validated with a chain of 5 deltas: degraded since the validation. The snapshot pass
    ends the chain: healthy since that run closed (not since the first validation, as the
    facts alone would say), in Python, in SQL and in ``health --brief``."""
    stream = make_stream(stores=ONE)
    key = stream.key(ONE[0])
    stream.run(5)
    run_checks(fleet, POLICY)
    validated = last_run_ended(fleet.catalog, RunKind.VALIDATE)
    degraded = report(fleet, key).status
    assert degraded.status is StoreStatus.DEGRADED and degraded.recorded
    assert degraded.since is not None and degraded.since <= validated

    snapshot_pass(fleet, POLICY)
    snapshotted = last_run_ended(fleet.catalog, RunKind.SNAPSHOT)
    healthy = report(fleet, key)
    assert healthy.status == Status(
        StoreStatus.HEALTHY, "validated, no open problems", snapshotted, recorded=True
    )
    assert healthy.health.first_validated_at is not None
    assert healthy.health.first_validated_at < snapshotted  # the estimate the facts would give
    status, since, recorded = sql_since(fleet.catalog, key)
    assert (status, recorded) == ("healthy", True) and same_moment(since, snapshotted)

    changes = statuses_recorded(fleet.catalog)
    assert changes[-2:] == ["degraded", "healthy"]
    brief = statestore(fleet.catalog, "health", "--brief")
    assert brief.exit_code == 0, brief.output
    assert f"healthy  since {snapshotted:%Y-%m-%d %H:%M}  validated" in brief.output
    assert NOT_RECORDED not in brief.output
    assert statuses_recorded(fleet.catalog) == changes  # nothing changed: nothing recorded


def statuses_recorded(catalog: Catalog) -> list[str]:
    with catalog.engine.connect() as connection:
        return list(
            connection.execute(
                sa.text("SELECT status FROM read_store_status_changes ORDER BY change_id")
            ).scalars()
        )


def test_a_restore_is_not_a_validation(
    make_stream: Callable[..., StoreStream], fleet: Fleet
) -> None:
    """A lost delta, found by validation: broken. The restore to the newest intact batch
    resolves the problem: unknown since the restore, not healthy. A validation then finds the
    store sound: healthy since that validation."""
    stream = make_stream(stores=ONE)
    key = stream.key(ONE[0])
    stream.run(4)
    (stream.storage.root / stream.committed[ONE[0]][-1].path).unlink()
    run_checks(fleet, RESTORING)
    broken = report(fleet, key, RESTORING).status
    assert broken.status is StoreStatus.BROKEN and broken.recorded

    plan = plan_restore(fleet, stream.root, stream.query, 2, spark_checkpoint="")
    restore_query(fleet, plan, RESTORING)
    restored = last_run_ended(fleet.catalog, RunKind.RESTORE)
    unknown = report(fleet, key, RESTORING)
    assert unknown.status.status is StoreStatus.UNKNOWN and unknown.status.recorded
    assert unknown.status.reason == "restored; not validated since"
    assert unknown.status.since == unknown.health.last_restored_at
    assert unknown.status.since is not None and unknown.status.since <= restored

    run_checks(fleet, RESTORING)
    validated = last_run_ended(fleet.catalog, RunKind.VALIDATE)
    healthy = report(fleet, key, RESTORING)
    assert healthy.status.status is StoreStatus.HEALTHY and healthy.status.recorded
    # since the validation: recorded by its health read once its results were in, or as it closed
    assert healthy.health.last_validated_at is not None and healthy.status.since is not None
    assert restored < healthy.health.last_validated_at <= healthy.status.since <= validated
    status, since, recorded = sql_since(fleet.catalog, key)
    assert (status, recorded) == ("healthy", True) and same_moment(since, healthy.status.since)
    assert statuses_recorded(fleet.catalog)[-3:] == ["broken", "unknown", "healthy"]


def test_a_store_never_recorded_shows_the_estimate_marked(
    make_stream: Callable[..., StoreStream], fleet: Fleet
) -> None:
    """No run and no health read has recorded the store: its since is the facts' estimate
    (its registration), marked; the first ``health`` records it, from that estimate."""
    stream = make_stream(stores=ONE)
    key = stream.key(ONE[0])
    stream.run(2)
    [facts] = fleet.catalog.store_health(POLICY.retention)
    estimate = store_status(facts, **POLICY.status_limits())
    assert estimate == Status(StoreStatus.UNKNOWN, "never validated", facts.created_at, False)
    assert f"since {facts.created_at.isoformat(timespec='seconds')} {NOT_RECORDED}" in str(estimate)
    status, since, recorded = sql_since(fleet.catalog, key)
    assert (status, recorded) == ("unknown", False) and same_moment(since, facts.created_at)

    brief = statestore(fleet.catalog, "health", "--brief")
    assert brief.exit_code == 3, brief.output  # unknown
    assert NOT_RECORDED not in brief.output
    assert report(fleet, key).status == Status(
        StoreStatus.UNKNOWN, "never validated", facts.created_at, recorded=True
    )
    assert statuses_recorded(fleet.catalog) == ["unknown"]
