"""The snapshot, validation and cleanup passes spread over Spark tasks
(:class:`~state_runtime.maintenance.spark.SparkSpread`) give what they give on one host
(:func:`~tests.maintenance.spread_checks.each_pass_alike`); a store whose lease another
owner holds is skipped by its Spark task as by a thread here."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog, RunKind
from state_runtime.maintenance import SnapshotStatus, cleanup_pass, snapshot_pass
from state_runtime.maintenance.spark import SparkSpread
from tests.maintenance.spread_checks import LATER, POLICY, each_pass_alike, fleet_of
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def spread_on(spark: SparkSession, catalog: Catalog) -> SparkSpread:
    return SparkSpread(spark, catalog.engine.url.render_as_string(hide_password=False), slices=2)


def test_each_pass_on_spark_as_on_one_host(
    spark: SparkSession, make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    each_pass_alike(make_stream, catalog, spread_on(spark, catalog))


@pytest.mark.connect
@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_a_spark_task_skips_a_store_leased_elsewhere(
    spark: SparkSession, make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    stream = make_stream()
    stream.run(5)
    spread = spread_on(spark, catalog)
    snapshot_pass(fleet_of(stream), POLICY, spread=spread)  # deltas 1-4 become deletable
    stream.run(4)  # every store due again
    busy = stream.key(stream.stores[0])
    elsewhere = catalog.start_run(RunKind.SNAPSHOT.value, "elsewhere")
    [lease] = catalog.acquire_leases([busy], "elsewhere", timedelta(minutes=5), elsewhere)
    assert lease is not None

    report = snapshot_pass(fleet_of(stream), POLICY, spread=spread)
    assert {o.key: o.status for o in report.outcomes} == {
        stream.key(s): SnapshotStatus.BUSY if stream.key(s) == busy else SnapshotStatus.WRITTEN
        for s in stream.stores
    }
    cleaned = cleanup_pass(fleet_of(stream), POLICY, now=LATER, dry_run=False, spread=spread)
    assert cleaned.busy == [busy]
    assert cleaned.deleted and all(v.file.key != busy for v in cleaned.deleted)


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_the_cli_runs_the_passes_on_spark(
    spark: SparkSession, make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    """``--on-spark``: the CLI's session (the fixture's, as ``spark_session`` finds it)."""
    stream = make_stream()
    stream.run(6)
    done = statestore(stream, "maintain", "--execute", "--on-spark", "--min-deltas", "4")
    assert done.exit_code == 0, done.output
    assert re.search(r"snapshots \(run \d+\): 3 written", done.output)
    checked = statestore(stream, "validate", "--full", "--on-spark")
    assert checked.exit_code == 0, checked.output
    [validate] = [r for r in catalog.recent_runs() if r.kind == RunKind.VALIDATE.value]
    assert validate.counts["stores"] == 3 and validate.counts["files"] > 0
    assert validate.counts["errors"] == 0
