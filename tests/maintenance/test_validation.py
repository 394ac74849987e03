"""Validation and the checks: a healthy fleet passes; broken files are named."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import RetentionPolicy, StoreProblem
from state_runtime.catalog.schema.tables import checkpoint_files, deletion_ledger
from state_runtime.maintenance import (
    CallbackProgress,
    CheckName,
    Fate,
    Fleet,
    MaintenancePolicy,
    Severity,
    run_checks,
    snapshot_pass,
    validate_stores,
)
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=5, lag_warn_deltas=6, lag_error_deltas=9)


def built(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Three stores, 8 versions, a snapshot at version 5."""
    stream = make_stream()
    stream.run(5)
    snapshot_pass(fleet_on(stream), POLICY)
    stream.run(3)
    return stream


def test_a_healthy_fleet_passes_every_check(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)
    stream.storage.requests.reset()
    report = run_checks(fleet_on(stream), POLICY)
    assert report.ok and all(o.passed for o in report.outcomes), report.outcomes
    counts = report.validation.counts()
    # versions 8 and 7 load from the snapshot at 5 plus deltas 6..8: 4 files per store; the
    # snapshots were verified by the snapshot pass (read by the sample or found present),
    # the 9 deltas are new: read
    sampled = counts["files_sampled"]
    assert counts == {
        "stores": 3,
        "versions": 6,
        "files": 9 + sampled,
        "files_new": 9,
        "files_rechecked": 0,
        "files_sampled": sampled,
        "files_present": 3 - sampled,
        "errors": 0,
        "stores_with_errors": 0,
        "bytes_read": counts["bytes_read"],
    }
    listed = {"list": 3 - sampled} if sampled < 3 else {}
    assert stream.storage.requests.counts == {"read": 9 + sampled} | listed
    assert counts["bytes_read"] == stream.storage.requests.bytes_read
    run = stream.catalog.run(report.run_id)
    assert run is not None and run.kind == "validate" and run.counts["orphan_files"] == 0


def test_only_stores_of_the_fleets_roots_are_validated(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A fleet narrowed to one root validates a store of another root named in ``only``
    no more than it lists it (that root's folder is gone: reading it would fail the run)."""
    here, there = make_stream("here"), make_stream("there")
    here.run(2)
    there.run(2)
    shutil.rmtree(there.storage.root)
    fleet = Fleet(here.catalog, roots=[here.root], owner="tests")
    store = here.stores[0]
    only = [here.key(store), there.key(store)]
    assert [r.key for r in fleet.stores(only)] == [here.key(store)]
    report = validate_stores(fleet, POLICY, only=only)
    assert report.ok and report.stores == 1, report.errors


def test_a_run_over_a_few_stores_reads_the_open_problems_of_their_roots_only(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-catalog fleet validating one store of one root reads the open problems (those
    open at the run's start, and those naming files) of that root only, not the catalog's."""
    here, there = make_stream("here"), make_stream("there")
    here.run(2)
    there.run(2)
    catalog = here.catalog
    read = catalog.problems
    roots: list[str | None] = []

    def spied(**kw: Any) -> list[StoreProblem]:
        roots.append(kw.get("root"))
        return read(**kw)

    monkeypatch.setattr(catalog, "problems", spied)
    report = validate_stores(Fleet(catalog, owner="tests"), POLICY, only=[here.key(here.stores[0])])
    assert report.ok and report.stores == 1, report.errors
    assert roots and set(roots) == {here.root}, roots


def test_the_progress_total_is_the_fleets_own_count(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A fleet narrowed to one root counts that root's stores for its progress total (not
    the whole catalog's), and a run naming stores counts those in scope: the total is what
    the pass then walks."""
    here, there = make_stream("here"), make_stream("there")
    here.run(2)
    there.run(2)
    fleet = Fleet(here.catalog, roots=[here.root], owner="tests")
    seen: list[tuple[int, int]] = []
    progress = CallbackProgress(lambda _, done, total: seen.append((done, total)))
    validate_stores(fleet, POLICY, progress=progress)
    assert seen == [(0, 3), (3, 3)]
    seen.clear()
    only = [here.key(here.stores[0]), there.key(there.stores[0])]
    validate_stores(fleet, POLICY, only=only, progress=progress)
    assert seen == [(0, 1), (1, 1)]
    assert Fleet(here.catalog, owner="tests").store_count() == 6


def test_a_deleted_middle_delta_is_named(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)
    store = stream.stores[1]
    middle = stream.committed[store][6]  # version 7: needed by versions 7 and 8
    (stream.storage.root / middle.path).unlink()
    report = run_checks(fleet_on(stream), POLICY)
    lineage = report.outcome(CheckName.LINEAGE)
    assert not lineage.passed and not report.ok
    [finding] = lineage.findings
    assert finding.key == stream.key(store) and finding.path == middle.path
    assert finding.problem == "file is missing from storage" and finding.version == 7
    assert middle.path in lineage.summary


def test_a_corrupt_snapshot_is_named(make_stream: Callable[..., StoreStream]) -> None:
    stream = built(make_stream)
    store = stream.stores[0]
    [snapshot] = (stream.storage.root / store.directory).glob("*.snapshot")
    data = bytearray(snapshot.read_bytes())
    data[-10] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    # verified by the snapshot pass and damaged in place, size kept: a full validation reads
    # it at once (the sample in time: test_incremental_validation)
    findings = validate_stores(fleet_on(stream), replace(POLICY, verify_sample_percent=100)).errors
    assert {f.path for f in findings} == {snapshot.relative_to(stream.storage.root).as_posix()}
    assert "checksum" in findings[0].problem


def test_a_truncated_delta_and_a_catalog_gap_are_named(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    store = stream.stores[2]
    newest = stream.committed[store][-1]
    path = stream.storage.root / newest.path
    path.write_bytes(path.read_bytes()[:100])
    problems = {f.path: f.problem for f in validate_stores(fleet_on(stream), POLICY).errors}
    assert problems == {
        newest.path: f"size is 100 bytes, the catalog recorded {newest.bytes_written}"
    }


def test_a_needed_file_deleted_by_a_faulty_tool_is_named_with_the_ledger_entry(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(4)
    store = stream.stores[0]
    second = stream.committed[store][1]  # versions 4 and 3 load through delta 2
    catalog = stream.catalog
    run_id = catalog.start_run("cleanup", "faulty-tool")
    with catalog.engine.begin() as connection:  # what a cleanup that ignored the rules does
        f = checkpoint_files.c
        file_id = connection.execute(
            sa.update(checkpoint_files)
            .where(f.path == second.path)
            .values(state="deleted")
            .returning(f.file_id)
        ).scalar_one()
        connection.execute(
            sa.insert(deletion_ledger).values(
                file_id=file_id, run_id=run_id, reason="by hand", deleted_at=datetime.now(UTC)
            )
        )
    (stream.storage.root / second.path).unlink()
    findings = validate_stores(fleet_on(stream), POLICY).errors
    assert [(f.path, f.version) for f in findings] == [(second.path, 4), (second.path, 3)]
    assert all("no live file for version 2" in f.problem for f in findings)
    assert all(f"cleanup run {run_id}: by hand" in f.problem for f in findings)


def test_snapshot_lag_warns_then_fails(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(7)
    lag = run_checks(fleet_on(stream), POLICY).outcome(CheckName.SNAPSHOT_LAG)
    assert not lag.passed and lag.severity is Severity.WARNING
    assert {f.key for f in lag.findings} == {stream.key(s) for s in stream.stores}
    stream.run(2)
    lag = run_checks(fleet_on(stream), POLICY).outcome(CheckName.SNAPSHOT_LAG)
    assert lag.severity is Severity.ERROR and lag.figures["max_deltas_since_snapshot"] == 9

    broken = stream.stores[0]  # its newest delta goes: the store no longer loads
    (stream.storage.root / stream.committed[broken][-1].path).unlink()
    report = run_checks(fleet_on(stream), POLICY)
    lag = report.outcome(CheckName.SNAPSHOT_LAG)  # no "a cold load reads ..." for it
    assert {f.key for f in lag.findings} == {stream.key(s) for s in stream.stores[1:]}
    [finding] = report.outcome(CheckName.LINEAGE).findings
    assert finding.damage is not None and finding.damage.fate is Fate.RESTORABLE
    assert finding.damage.batch == 7 and "--to-batch 7" in str(finding)


def test_orphan_growth_compares_with_the_previous_validation(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    policy = MaintenancePolicy(snapshot_min_deltas=5, orphan_growth_warn_files=1)
    first = run_checks(fleet_on(stream), policy).outcome(CheckName.ORPHAN_GROWTH)
    assert first.passed and "first validation" in first.summary
    for store in stream.stores:
        stream.abandoned_attempt(store)
    stream.commit()  # the attempts lose: orphans
    grown = run_checks(fleet_on(stream), policy).outcome(CheckName.ORPHAN_GROWTH)
    assert not grown.passed and grown.severity is Severity.WARNING
    assert grown.figures["orphan_growth"] == 3


def test_retention_out_of_policy_when_cleanup_falls_behind(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = built(make_stream)
    now = datetime.now(UTC) + timedelta(days=3)
    check = run_checks(fleet_on(stream), POLICY, now=now).outcome(CheckName.RETENTION)
    assert not check.passed and len(check.findings) == 3
    unsafe = MaintenancePolicy(retention=RetentionPolicy(window=timedelta(minutes=1)))
    refused = run_checks(fleet_on(stream), unsafe).outcome(CheckName.RETENTION)
    assert refused.severity is Severity.ERROR and "configured minimum" in refused.summary
