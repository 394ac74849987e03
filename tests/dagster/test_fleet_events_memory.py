"""The Dagster events of a validation do not grow in memory with the fleet (issue 35): the
validation job's step reads its ``ChecksReport``'s store reports back a page at a time
(``HealthSpool``), and logs each page's changed stores' events as it goes, the fleet's
materialization built from the same pages (its totals, and the table's longest chains).

Measured as ``tests/maintenance/test_fleet_memory.py`` measures a pass (tracemalloc, one
catalog of 400 and 4,000 stores), each fleet's first report to a fresh Dagster instance:
every store's state and per-store checks are new, so every store has events. Taking the whole
list of reports, the events of every store were built before any was logged: 10x the stores,
10x the events held.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster import instance_for_test

from dagster_project.defs.partitions import state_stores
from dagster_project.defs.store_events import changed_store_events, fleet_materialization
from state_runtime.maintenance import CHECKS, Fleet, HealthSpool, StoreNames, run_checks
from tests.maintenance.test_fleet_memory import NOW, POLICY, RATIO, _peak, built_fleets

pytestmark = pytest.mark.slow
PER_STORE = [check.name.value for check in CHECKS if check.per_store]
SMALL, LARGE = 400, 4_000
"""Smaller fleets than the passes' test (2,000 and 20,000): every store's events are logged
to a Dagster instance here, about 50 ms each on its default storage."""


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Fleet]]:
    yield from built_fleets(tmp_path_factory.mktemp("fleet"), SMALL, LARGE)


@pytest.fixture(scope="module")
def reports(fleets: tuple[Fleet, Fleet]) -> Iterator[list[HealthSpool]]:
    """Each fleet's validation report's store reports (outside the measurement)."""
    spools = [run_checks(fleet, POLICY, now=NOW).health for fleet in fleets]
    yield spools
    for spool in spools:
        spool.close()


def _report(fleet: Fleet, health: HealthSpool) -> int:
    """What the validation job's step logs, to a fresh instance: the events counted."""
    with instance_for_test() as instance:
        names = StoreNames.of(fleet.catalog)
        partitions = [names.name(r.key) for r in health]
        instance.add_dynamic_partitions(state_stores.name or "", partitions)
        fleet_materialization(health.pages(), names)
        events = 1
        for changed in changed_store_events(
            instance, fleet.catalog, health.pages(), names, POLICY, set(partitions), PER_STORE
        ):
            events += len(changed.states) + len(changed.evaluations)
            changed.logged()
        return events


def test_a_validations_events_stay_flat_from_400_to_4000_stores(
    fleets: tuple[Fleet, Fleet], reports: list[HealthSpool]
) -> None:
    _report(fleets[0], reports[0])  # warm: imports, the engine's statements
    peaks = []
    for fleet, health, stores in zip(fleets, reports, (SMALL, LARGE), strict=True):
        peak, events = _peak(lambda f, h=health: _report(f, h), fleet)
        # every store's state and per-store checks (new to the instance), the fleet's once
        assert events == 1 + (1 + len(PER_STORE)) * stores, (stores, events)
        peaks.append(peak)
    print(f"validation's events: peak {peaks} bytes at {SMALL}/{LARGE} stores")
    assert peaks[1] < RATIO * peaks[0], f"events: peak {peaks} bytes at {SMALL}/{LARGE}"
