"""A report queued before a validation from the CLI names it whatever Dagster's own runs
recorded between (they count among the ``RUNS`` a read returns): it logs the validated state,
and the validation's own report has no state left to log (its fingerprint is reported)."""

from __future__ import annotations

from collections.abc import Callable

from dagster import DagsterInstance

from dagster_project.defs.catalog_events import RUNS
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_report_races import (
    assert_named,
    described,
    queued_report,
    validate_from_the_cli,
)
from tests.maintenance.streams import StoreStream


def test_a_queued_report_names_the_validation_after_many_dagster_runs(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    queued, run = queued_report(stream, instance)
    for _ in range(RUNS):  # Dagster's own passes, say snapshots of a busy fleet
        run_id = stream.catalog.start_run("snapshot", "dagster:some-run")
        stream.catalog.finish_run(run_id, "succeeded")
    by_cli = validate_from_the_cli(stream)
    run()
    tick(stream, instance, queued.cursor)  # the validation's own report
    assert_named(stream, instance, by_cli)
    assert all(f"and older runs (over {RUNS} since)" in d for _, d in described(instance).values())
