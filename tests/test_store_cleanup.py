"""Store-level cleanup: keeps what retained versions need and young files; dry run by default."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from state_runtime.errors import CheckpointFileMissing, InvalidArgument
from state_runtime.storage import Storage
from state_runtime.store.file_cleanup import cleanup

from .store_helpers import commit_rows, provider_for, state_of


def _history(storage: Storage):  # type: ignore[no-untyped-def]
    p = provider_for(storage)
    infos = [commit_rows(p, None, {"a": 0})]
    for i in range(1, 6):
        infos.append(commit_rows(p, infos[-1], {f"k{i}": i}))
    return p, infos


def test_dry_run_is_the_default_and_deletes_nothing(storage: Storage) -> None:
    p, infos = _history(storage)
    p.snapshot(4, infos[3].checkpoint_id)
    before = sorted(f.path for f in storage.list("state"))
    report = cleanup(p, infos[-1].ref, min_age=timedelta(0))
    assert report.dry_run and report.deletable and report.deleted == []
    assert sorted(f.path for f in storage.list("state")) == before


def test_keeps_what_the_retained_versions_need_and_deletes_the_rest(storage: Storage) -> None:
    p, infos = _history(storage)  # versions 1..6
    snap = p.snapshot(4, infos[3].checkpoint_id)
    orphan = commit_rows(provider_for(storage), infos[4], {"zombie": 1})  # another v6 attempt
    report = cleanup(p, infos[-1].ref, min_age=timedelta(0), dry_run=False)
    assert [r.version for r in report.retained] == [6, 5]
    expected_needed = {snap.path, infos[4].path, infos[5].path}
    assert set(report.needed) == expected_needed
    assert {d.path for d in report.deletable} == {i.path for i in infos[:4]} | {orphan.path}
    reasons = {d.path: d.reason for d in report.deletable}
    assert reasons[orphan.path].startswith("orphan")
    assert "older than the retained" in reasons[infos[0].path]
    assert "newer snapshot" in reasons[infos[3].path]
    assert {f.path for f in storage.list("state")} == expected_needed
    fresh = provider_for(storage)
    assert state_of(fresh, infos[-1]) == {"a": 0, **{f"k{i}": i for i in range(1, 6)}}
    assert state_of(provider_for(storage), infos[-2])["k4"] == 4
    assert report.reclaimable_bytes == sum(d.size for d in report.deletable)


def test_files_younger_than_the_window_are_never_deleted(storage: Storage) -> None:
    p, infos = _history(storage)
    snap = p.snapshot(5, infos[4].checkpoint_id)
    report = cleanup(p, infos[-1].ref, min_age=timedelta(hours=1), dry_run=False)
    assert report.deletable == [] and report.deleted == []
    later = datetime.now(UTC) + timedelta(hours=2)
    report = cleanup(p, infos[-1].ref, min_age=timedelta(hours=1), dry_run=False, now=later)
    assert sorted(report.deleted) == sorted(i.path for i in infos[:5])  # the snapshot replaces them
    assert {f.path for f in storage.list("state")} == {snap.path, infos[5].path}


def test_a_broken_lineage_stops_cleanup_before_any_deletion(storage: Storage) -> None:
    p, infos = _history(storage)
    storage.delete([infos[2].path])
    before = sorted(f.path for f in storage.list("state"))
    with pytest.raises(CheckpointFileMissing) as err:
        cleanup(p, infos[-1].ref, min_age=timedelta(0), dry_run=False)
    assert err.value.path == infos[2].path
    assert sorted(f.path for f in storage.list("state")) == before


def test_unknown_files_are_left_alone(storage: Storage) -> None:
    p, infos = _history(storage)
    storage.write_if_absent("state/0/0/default/README.txt", b"operator notes")
    report = cleanup(p, infos[-1].ref, min_age=timedelta(0), dry_run=False)
    assert storage.exists("state/0/0/default/README.txt")
    assert "state/0/0/default/README.txt" not in {d.path for d in report.deletable}
    with pytest.raises(InvalidArgument):
        cleanup(p, infos[-1].ref, min_age=timedelta(seconds=-1))
