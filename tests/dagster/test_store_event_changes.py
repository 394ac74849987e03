"""Events follow changes, not the fleet's size: a pass reports a store's state and its
per-store checks only when they changed since the last report; the fleet's figures are one
event per pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster import DagsterEventType, DagsterInstance, materialize

from dagster_project.defs.assets import state_store_health
from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.store_events import REPORTED
from tests.dagster.conftest import resources_for, store_name
from tests.dagster.test_dagster_definitions import FAST, run_checks
from tests.maintenance.streams import StoreStream

ASSET_EVENTS = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_OBSERVATION}


def store_events(result: Any) -> list[str]:
    """The partitions of ``state_checkpoints`` a run reported a state on."""
    return sorted(
        e.partition
        for e in result.all_events
        if e.event_type in ASSET_EVENTS and e.asset_key == state_checkpoints.key
    )


def per_store(result: Any) -> dict[str, list[str | None]]:
    """The partitions each per-store check was evaluated on."""
    found: dict[str, list[str | None]] = {}
    for e in result.get_asset_check_evaluations():
        if e.partition is not None:
            found.setdefault(e.check_name, []).append(e.partition)
    return found


def fleet_events(result: Any) -> int:
    return sum(
        1
        for e in result.all_events
        if e.event_type in ASSET_EVENTS and e.asset_key == state_store_health.key
    )


def test_a_pass_reports_what_changed_and_the_fleet_once(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    resources = resources_for(stream.catalog, FAST)
    names = {s: store_name(stream, s) for s in stream.stores}
    instance.add_dynamic_partitions("state_stores", list(names.values()))

    def health() -> Any:
        return materialize([state_store_health], resources=resources, instance=instance)

    first = health()  # never validated: every store unknown
    assert store_events(first) == sorted(names.values()) and fleet_events(first) == 1
    validated = run_checks(resources, instance)  # every store healthy now
    assert store_events(validated) == sorted(names.values())
    assert {c: len(p) for c, p in per_store(validated).items()} == {
        "store_status": 3,
        "commit_lag": 3,
    }
    quiet = health()  # nothing changed: the fleet's figures only
    assert store_events(quiet) == [] and fleet_events(quiet) == 1
    kept = instance.run_storage.get_cursor_values({f"{REPORTED}/state/query-1"})
    assert set(kept) == {f"{REPORTED}/state/query-1"}

    # a lost file, found by a validation: that store's state and its status check only
    broken = stream.stores[1]
    (stream.storage.root / stream.committed[broken][4].path).unlink()
    validation = run_checks(resources, instance)
    assert store_events(validation) == [names[broken]] and fleet_events(validation) == 1
    # the broken store's status check; each per-store check's worst store (its headline, the
    # broken store now) in every pass
    headline = {"store_status": [names[broken]], "commit_lag": [names[broken]]}
    assert per_store(validation) == headline
    again = run_checks(resources, instance)
    assert store_events(again) == [] and fleet_events(again) == 1
    assert per_store(again) == headline

    # every store commits: a new latest version each, shown in the fleet's one event only
    stream.run(1)
    committed = health()
    assert store_events(committed) == [] and fleet_events(committed) == 1
