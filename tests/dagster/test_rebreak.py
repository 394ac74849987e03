"""Reproducer (review2): the failures sensor's run skips its observation of a broken store
when the key-value store says a *report* logged that state last; but the key-value store is
only what the last report pass logged, not the partition's latest event. A store reported
broken, recovered (recorded only by the failures sensor's run: no report pass between), and
broken again the same way keeps a *healthy* latest state while Failed -- and the next report
logs nothing either (same fingerprint as its key-value store)."""

from __future__ import annotations

from collections.abc import Callable

from dagster import DagsterInstance

from state_runtime.maintenance import Fleet, run_checks
from tests.dagster.conftest import store_name
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_dagster_definitions import FAST
from tests.dagster.test_report_races import described, validate_from_the_cli
from tests.dagster.test_store_failures import FailureSensor
from tests.maintenance.streams import StoreStream


def test_broken_again_shows_broken(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    instance.add_dynamic_partitions("state_stores", [store_name(stream, s) for s in stream.stores])
    broken = store_name(stream, stream.stores[1])
    cursor = tick(stream, instance, None).cursor
    lost = stream.storage.root / stream.committed[stream.stores[1]][4].path
    content = lost.read_bytes()
    validate_from_the_cli(stream)  # breaks it, validates
    cursor = tick(stream, instance, cursor).cursor  # report: broken (key-value store: broken)
    sensor = FailureSensor(stream, instance)
    assert sensor.fail_broken() == [broken]
    assert described(instance)[broken][0] == "broken"
    lost.write_bytes(content)  # repaired, validated from the CLI; no report pass yet
    run_checks(Fleet(stream.catalog, owner="ops-laptop:4242"), FAST)
    assert sensor.tick() == ([], [broken])
    assert described(instance)[broken][0] == "healthy"
    validate_from_the_cli(stream)  # broken again the same way
    assert sensor.fail_broken() == [broken]  # Failed ...
    assert described(instance)[broken][0] == "broken", "Failed, latest state says healthy"
    tick(stream, instance, cursor)  # nor does the next report log it
    assert described(instance)[broken][0] == "broken", "after the report too"
