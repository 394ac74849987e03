"""Cleanup deletes the plan in chunks, several workers at once: exactly what one worker
deletes, on real files and on S3 (moto); a storage failure mid-chunk leaves the catalog and
storage consistent, and the next run finishes the plan."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog, FileState
from state_runtime.errors import StorageError
from state_runtime.identity import StoreId
from state_runtime.maintenance import CleanupReport, Fleet, cleanup_pass
from state_runtime.storage import DeleteResult, LocalStorage, Storage
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cleanup import LATER, POLICY, assert_retained_versions_load, snapshotted
from tests.s3_fixtures import MotoS3

STORES = [StoreId(0, p) for p in range(12)]
CHUNK = 7  # files: far fewer than the plan (5 or 6 a store, 12 stores)


def fleet_of(stream: StoreStream, storage: Storage | None = None) -> Fleet:
    return Fleet(stream.catalog, open_storage=lambda root: storage or stream.storage, owner="t")


def stored(stream: StoreStream) -> set[str]:
    """The paths of the files in the stream's storage (listed: this is the test's view)."""
    return {f.path for f in stream.storage.list("state")}


def cleaned(stream: StoreStream, workers: int) -> tuple[CleanupReport, set[str]]:
    """Execute cleanup with ``workers`` in chunks of CHUNK files; check it deleted exactly
    the plan (storage and ledger) and every retained version loads."""
    plan = cleanup_pass(fleet_of(stream), POLICY, now=LATER)
    planned = {v.file.path for v in plan.planned}
    assert plan.planned_files == len(planned) > 3 * CHUNK
    before = stored(stream)
    report = cleanup_pass(
        fleet_of(stream), POLICY, now=LATER, dry_run=False, workers=workers, chunk_files=CHUNK
    )
    assert report.deleted_files == plan.planned_files and not report.failed and not report.busy
    assert stored(stream) == before - planned
    ledger = stream.catalog.deletion_history(root=stream.root, limit=10_000)
    assert sorted(d.path for d in ledger) == sorted(planned)
    assert {d.run_id for d in ledger} == {report.run_id}
    assert_retained_versions_load(stream)
    return report, planned


def shape(report: CleanupReport) -> tuple[object, ...]:
    return (report.deleted_files, report.deleted_bytes, Counter(report.reasons))


def test_several_workers_delete_exactly_what_one_worker_deletes(
    make_stream: Callable[..., StoreStream],
) -> None:
    one, planned_one = cleaned(snapshotted(make_stream("one", stores=STORES)), workers=1)
    many, planned_many = cleaned(snapshotted(make_stream("many", stores=STORES)), workers=4)
    assert shape(one) == shape(many)
    assert {p.split("/")[-1].split("_")[0] for p in planned_one} == {
        p.split("/")[-1].split("_")[0] for p in planned_many
    }


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_several_workers_on_s3_delete_exactly_the_plan(
    moto_s3: MotoS3, catalog: Catalog, tmp_path: Path
) -> None:
    stream = snapshotted(StoreStream(catalog, moto_s3.storage(), STORES))
    cleaned(stream, workers=4)


class FailingDeletes(LocalStorage):
    """Local storage whose ``fail_at``-th delete removes the first half of its batch (at least
    one file), then
    raises, as a storage that breaks mid-request would."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.calls = itertools.count(1)
        self.fail_at = fail_at

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        if next(self.calls) == self.fail_at:  # one count per call, whatever the thread
            super().delete(paths[: (len(paths) + 1) // 2])
            raise StorageError("connection reset mid-delete", path=paths[0])
        return super().delete(paths)


def test_a_failure_mid_chunk_leaves_catalog_and_storage_consistent(
    make_stream: Callable[..., StoreStream], tmp_path: Path
) -> None:
    stream = snapshotted(make_stream("checkpoint", stores=STORES))
    planned = {v.file.path for v in cleanup_pass(fleet_of(stream), POLICY, now=LATER).planned}
    before = stored(stream)
    failing = FailingDeletes(tmp_path / "checkpoint", fail_at=3)
    with pytest.raises(StorageError, match="mid-delete"):
        cleanup_pass(
            fleet_of(stream, failing),
            POLICY,
            now=LATER,
            dry_run=False,
            workers=3,
            chunk_files=CHUNK,
            delete_batch=4,
        )
    [failed] = [r for r in stream.catalog.recent_runs() if r.kind == "cleanup"]
    assert failed.outcome == "failed" and "mid-delete" in (failed.error or "")
    recorded = {d.path for d in stream.catalog.deletion_history(root=stream.root, limit=10_000)}
    assert recorded and recorded < planned  # some chunks were done, not all
    assert not stored(stream) & recorded  # nothing recorded deleted is still stored
    gone_unrecorded = before - stored(stream) - recorded
    assert gone_unrecorded  # the half batch deleted before the error
    for path in gone_unrecorded:  # claimed: the next run resumes it
        found = stream.catalog.explain(stream.root, path, POLICY.retention).file
        assert found is not None and found.state == FileState.DELETING, path
    assert stored(stream) >= before - planned  # nothing outside the plan went
    assert_retained_versions_load(stream)

    again = cleanup_pass(
        fleet_of(stream), POLICY, now=LATER, dry_run=False, workers=3, chunk_files=CHUNK
    )
    assert not again.failed
    assert stored(stream) == before - planned
    ledger = stream.catalog.deletion_history(root=stream.root, limit=10_000)
    assert sorted(d.path for d in ledger) == sorted(planned)  # each recorded once
    assert_retained_versions_load(stream)
