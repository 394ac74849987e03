"""The snapshot, validation and cleanup passes spread over Spark tasks
(:class:`~state_runtime.maintenance.spark.SparkSpread`) give what they give on one host:
two roots built alike in one catalog, one maintained here and one on Spark, end with the
same outcomes, each pass one recorded run; a store whose lease another owner holds is
skipped by its Spark task as by a thread here."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog, RunKind
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    SnapshotReport,
    SnapshotStatus,
    cleanup_pass,
    run_checks,
    snapshot_pass,
)
from state_runtime.maintenance.spark import SparkSpread
from state_runtime.maintenance.spread import Spread
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

POLICY = MaintenancePolicy(snapshot_min_deltas=4, verify_sample_percent=50)
LATER = datetime.now(UTC) + timedelta(days=1)  # every file is past the window


def spread_on(spark: SparkSession, catalog: Catalog) -> SparkSpread:
    return SparkSpread(spark, catalog.engine.url.render_as_string(hide_password=False), slices=2)


def fleet_of(stream: StoreStream) -> Fleet:
    """The stream's root alone; its storage opened by URI, as the Spark tasks open it."""
    return Fleet(stream.catalog, roots=[stream.root], owner="tests")


def snapshots(report: SnapshotReport) -> dict[Any, tuple[str, int, int]]:
    return {
        o.key.store: (o.status.value, o.version, o.deltas_since_snapshot) for o in report.outcomes
    }


def runs(catalog: Catalog, kind: RunKind) -> set[int]:
    return {r.run_id for r in catalog.recent_runs() if r.kind == kind.value}


def test_each_pass_on_spark_as_on_one_host(
    spark: SparkSession, make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    here, there = make_stream("here"), make_stream("there")
    for stream in (here, there):
        stream.run(6)
        stream.abandoned_attempt(stream.stores[0])
    spread = spread_on(spark, catalog)

    def both(run: Callable[[Fleet, Spread | None], Any]) -> tuple[Any, Any]:
        return run(fleet_of(here), None), run(fleet_of(there), spread)

    before = runs(catalog, RunKind.SNAPSHOT)
    local, spark_ = both(lambda f, s: snapshot_pass(f, POLICY, spread=s))
    assert snapshots(local) == snapshots(spark_)
    assert {o.status for o in spark_.outcomes} == {SnapshotStatus.WRITTEN}
    assert runs(catalog, RunKind.SNAPSHOT) - before == {local.run_id, spark_.run_id}

    for stream in (here, there):
        stream.run(3)
        delta = stream.committed[stream.stores[1]][-1]  # new: this validation reads it
        (stream.storage.root / delta.path).write_bytes(b"not a delta")
    local, spark_ = both(lambda f, s: run_checks(f, POLICY, sampler=random.Random(5), spread=s))
    assert local.validation.counts() == spark_.validation.counts()
    assert local.validation.counts()["files_sampled"] > 0
    found = [
        [(f.key.store, f.version, f.damage and f.damage.fate) for f in report.validation.errors]
        for report in (local, spark_)
    ]
    assert found[0] == found[1] and len(found[0]) == 1

    dry = cleanup_pass(fleet_of(there), POLICY, now=LATER, spread=spread)
    assert dry.dry_run and dry.run_id is None and dry.planned_files
    local, spark_ = both(lambda f, s: cleanup_pass(f, POLICY, now=LATER, dry_run=False, spread=s))
    assert local.counts() == spark_.counts()
    assert spark_.deleted_files == dry.planned_files and spark_.counts()["held_stores"] == 1
    for stream in (here, there):
        for store in stream.stores:
            if store != stream.stores[1]:
                assert stream.loaded(store, 9) == stream.expected(store, 9)


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
