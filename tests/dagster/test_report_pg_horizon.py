"""A report's description names the runs outside Dagster whose findings the state it logs
holds, even those above an older writing transaction still open on PostgreSQL (a long
maintenance pass, a slow commit): its cursor waits for them, its description must not (the
validation's own report has no state left to log)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from dagster import DagsterInstance

from tests.catalog.test_positions import writing_elsewhere
from tests.dagster.conftest import BOTH_CATALOGS
from tests.dagster.test_catalog_events import tick
from tests.dagster.test_report_races import assert_named, queued_report, validate_from_the_cli
from tests.maintenance.streams import StoreStream


@BOTH_CATALOGS
def test_a_queued_report_names_the_validation_while_an_older_write_is_open(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    stream = make_stream()
    stream.run(6)
    queued, run = queued_report(stream, instance)
    postgres = stream.catalog.engine.dialect.name == "postgresql"
    with writing_elsewhere(stream.catalog) if postgres else nullcontext():
        by_cli = validate_from_the_cli(stream)
        run()
    tick(stream, instance, queued.cursor)  # the validation's own report
    assert_named(stream, instance, by_cli)
