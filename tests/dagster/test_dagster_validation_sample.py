"""The validation job reads what changed: the resource's ``verify_sample_percent``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dagster import DagsterInstance

from dagster_project.defs.resources import MaintenanceResource
from tests.dagster.conftest import resources_for
from tests.dagster.test_dagster_definitions import FAST, check_results, run_checks
from tests.maintenance.streams import StoreStream


def test_the_resource_sets_the_sample_and_a_second_run_reads_nothing(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    assert MaintenanceResource(verify_sample_percent=0).policy().verify_sample_percent == 0
    stream = make_stream()
    stream.run(3)
    resources = resources_for(stream.catalog, replace(FAST, verify_sample_percent=0))

    def figures() -> tuple[float, float]:
        lineage = check_results(run_checks(resources, instance, "lineage_valid"))["lineage_valid"]
        assert lineage.passed
        return lineage.metadata["files"].value, lineage.metadata["files_present"].value

    assert figures() == (9, 0)  # 3 stores, 3 deltas each, never verified
    assert figures() == (0, 9)
    stream.run(1)  # one new delta per store (no snapshot: the chains start at 1)
    assert figures() == (3, 9)
    (stream.storage.root / stream.committed[stream.stores[0]][1].path).unlink()
    lineage = check_results(run_checks(resources, instance, "lineage_valid"))["lineage_valid"]
    assert not lineage.passed
    assert lineage.metadata["first_file"].value == stream.committed[stream.stores[0]][1].path
