"""The per-file reports (reconcile, relocate, cleanup's files, unfinished writes) word their
lines in ``summary()`` and ``rows()`` (``file_rows()``); the CLI and Dagster's metadata show
exactly those words, on real files and a real catalog."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from rich.console import Console

from dagster_project.defs.metadata import cleanup_metadata, reconcile_metadata
from state_runtime.cli.passes import print_cleanup
from state_runtime.cli.printing import print_leftovers
from state_runtime.cli.recovery import print_reconcile, print_relocation
from state_runtime.maintenance import (
    MaintenancePolicy,
    StoreNames,
    cleanup_pass,
    reconcile,
    relocate_root,
)
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy()


def printed(printer: Callable[[Console, object], None], report: object) -> list[str]:
    console = Console(record=True, width=400, color_system=None)
    printer(console, report)
    return console.export_text().splitlines()


def test_reconcile_lines_come_from_its_rows(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(2)
    store = stream.stores[0]
    lost, _ = stream.write(store)  # written, never recorded
    stream.providers[store].drop_cache()
    stream.run(1)
    garbage = f"state/0/1/default/9_{'a' * 32}.delta"
    (stream.storage.root / garbage).write_bytes(b"garbage")

    report = reconcile(fleet_on(stream), POLICY, min_age=timedelta(0))
    rows = report.rows()
    assert {r["path"]: r["recorded_as"] for r in rows}.keys() == {lost.path, garbage}
    assert f"recorded {lost.path} as orphan" in [r["detail"] for r in rows]
    assert printed(print_reconcile, report) == [
        report.summary(),
        *(f"  {r['detail']}" for r in rows),
    ]
    metadata = reconcile_metadata(report)
    assert metadata["summary"].value == report.summary()
    for row in rows:
        assert f"| {row['path']} | {row['recorded_as']} |" in str(metadata["files"].value)


def test_relocate_lines_come_from_its_rows(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream("old")
    stream.run(2)
    old = stream.storage
    new = LocalStorage(old.root.parent / "new")
    dry = relocate_root(stream.catalog, old.uri, new)
    assert dry.missing and len(dry.rows()) == len(dry.missing)
    assert printed(print_relocation, dry) == [
        dry.summary(),
        *(f"  {r['detail']}" for r in dry.rows()[:20]),
        *([f"  ... and {len(dry.rows()) - 20} more"] if len(dry.rows()) > 20 else []),
    ]
    shutil.copytree(old.root, new.root)
    done = relocate_root(stream.catalog, old.uri, new, dry_run=False)
    assert done.rows() == [] and printed(print_relocation, done) == [done.summary()]
    assert done.summary().endswith(f"store(s) now recorded below {new.uri}")


def test_cleanup_files_come_from_its_file_rows(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(2)
    lost, _ = stream.write(stream.stores[0])  # written, never recorded: an orphan once swept
    stream.providers[stream.stores[0]].drop_cache()
    stream.run(1)
    reconcile(fleet_on(stream), POLICY, min_age=timedelta(0))
    later = datetime.now(UTC) + timedelta(days=1)
    plan = cleanup_pass(fleet_on(stream), POLICY, now=later)
    files = plan.file_rows()
    assert any(f["file"].endswith(lost.path) for f in files)
    assert printed(print_cleanup, plan)[0] == plan.summary()
    shown = str(cleanup_metadata(plan, {}, StoreNames.of(stream.catalog))["would_delete"].value)
    for row in files[:50]:
        assert f"| {row['file']} | {row['bytes']} | {row['verdict']} | {row['reason']} |" in shown


def test_leftover_lines_come_from_its_rows(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(1)
    store = stream.stores[0]
    torn = stream.storage.root / store.directory / ".tmp-0badc0de.part"  # a crashed writer's
    torn.write_bytes(b"half a delta")
    stamp = (datetime.now(UTC) - timedelta(days=1)).timestamp()
    os.utime(torn, (stamp, stamp))

    for dry_run, verb in ((True, "would remove"), (False, "removed")):
        report = cleanup_pass(fleet_on(stream), POLICY, dry_run=dry_run).leftovers
        assert report.summary().endswith(
            f"1 found, {verb} 1, 0 too young (maybe still running), 0 failed"
        )
        details = [r["detail"] for r in report.rows()]
        assert details == [f"{verb} {stream.storage.uri}/{store.directory}/{torn.name}"]
        assert printed(print_leftovers, report) == [report.summary(), f"  {details[0]}"]
    assert not torn.exists()
