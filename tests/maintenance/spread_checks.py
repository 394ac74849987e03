"""What every :class:`~state_runtime.maintenance.spread.Spread` must give: the outcomes of
the snapshot, validation and cleanup passes on one host's threads. Two roots built alike in
one catalog, one maintained in threads here and one through the spread, must end alike, each
pass one recorded run (used by the Spark and the host-processes tests)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

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
from state_runtime.maintenance.spread import Spread
from tests.maintenance.streams import StoreStream

POLICY = MaintenancePolicy(snapshot_min_deltas=4, verify_sample_percent=50)
THREADS = replace(POLICY, processes=1)
"""The policy of the one-host way: threads in this process, whatever the host."""
LATER = datetime.now(UTC) + timedelta(days=1)  # every file is past the window


def fleet_of(stream: StoreStream) -> Fleet:
    """The stream's root alone; its storage opened by URI, as a spread's workers open it."""
    return Fleet(stream.catalog, roots=[stream.root], owner="tests")


def snapshots(report: SnapshotReport) -> dict[Any, tuple[str, int, int]]:
    return {
        o.key.store: (o.status.value, o.version, o.deltas_since_snapshot) for o in report.outcomes
    }


def runs(catalog: Catalog, kind: RunKind) -> set[int]:
    return {r.run_id for r in catalog.recent_runs() if r.kind == kind.value}


def each_pass_alike(
    make_stream: Callable[..., StoreStream], catalog: Catalog, spread: Spread
) -> None:
    """Snapshots, validation (a delta damaged in each root) and cleanup, each pass in
    threads over one root and through ``spread`` over its twin: the same outcomes."""
    here, there = make_stream("here"), make_stream("there")
    for stream in (here, there):
        stream.run(6)
        stream.abandoned_attempt(stream.stores[0])

    def both(run: Callable[[Fleet, MaintenancePolicy, Spread | None], Any]) -> tuple[Any, Any]:
        return run(fleet_of(here), THREADS, None), run(fleet_of(there), POLICY, spread)

    before = runs(catalog, RunKind.SNAPSHOT)
    local, spread_ = both(lambda f, p, s: snapshot_pass(f, p, spread=s))
    assert snapshots(local) == snapshots(spread_)
    assert {o.status for o in spread_.outcomes} == {SnapshotStatus.WRITTEN}
    assert runs(catalog, RunKind.SNAPSHOT) - before == {local.run_id, spread_.run_id}

    for stream in (here, there):
        stream.run(3)
        delta = stream.committed[stream.stores[1]][-1]  # new: this validation reads it
        (stream.storage.root / delta.path).write_bytes(b"not a delta")
    local, spread_ = both(lambda f, p, s: run_checks(f, p, sampler=random.Random(5), spread=s))
    assert local.validation.counts() == spread_.validation.counts()
    assert local.validation.counts()["files_sampled"] > 0
    found = [
        [(f.key.store, f.version, f.damage and f.damage.fate) for f in report.validation.errors]
        for report in (local, spread_)
    ]
    assert found[0] == found[1] and len(found[0]) == 1

    dry = cleanup_pass(fleet_of(there), POLICY, now=LATER, spread=spread)
    assert dry.dry_run and dry.run_id is None and dry.planned_files
    local, spread_ = both(lambda f, p, s: cleanup_pass(f, p, now=LATER, dry_run=False, spread=s))
    assert local.counts() == spread_.counts()
    assert spread_.deleted_files == dry.planned_files and spread_.counts()["held_stores"] == 1
    for stream in (here, there):
        for store in stream.stores:
            if store != stream.stores[1]:
                assert stream.loaded(store, 9) == stream.expected(store, 9)
