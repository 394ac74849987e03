"""A commit that changes nothing writes nothing (local and S3 via moto): the version keeps its
parent's checkpoint id; cold loads, roll forward, the change feed, snapshots and store-level
cleanup all handle it; a lost delta is never mistaken for a version without a file."""

from __future__ import annotations

from datetime import timedelta

import pytest

from state_runtime.errors import CannotLoadState
from state_runtime.storage import Storage
from state_runtime.store.file_cleanup import cleanup

from .store_helpers import commit_rows, provider_for, state_of


def test_an_idle_commit_makes_no_request(storage: Storage) -> None:
    provider = provider_for(storage)
    v1 = commit_rows(provider, None, {"a": 1})
    storage.requests.reset()
    v2 = commit_rows(provider, v1, {})
    assert storage.requests.counts == {}
    assert not v2.has_file and v2.checkpoint_id == v1.checkpoint_id
    assert (v2.version, v2.base_checkpoint_id, v2.lineage) == (2, v1.checkpoint_id, (v1.ref,))
    assert not storage.exists(v2.path)


def test_versions_without_files_load_everywhere(storage: Storage) -> None:
    writer = provider_for(storage)
    v1 = commit_rows(writer, None, {"a": 1})
    v2 = commit_rows(writer, v1, {})
    v3 = commit_rows(writer, v2, {})
    v4 = commit_rows(writer, v3, {"b": 2}, removes=("a",))
    v5 = commit_rows(writer, v4, {})
    assert [v.has_file for v in (v1, v2, v3, v4, v5)] == [True, False, False, True, False]
    assert v4.lineage == (v3.ref, v2.ref, v1.ref)
    for info, state in ((v2, {"a": 1}), (v3, {"a": 1}), (v4, {"b": 2}), (v5, {"b": 2})):
        assert state_of(provider_for(storage), info) == state  # cold, from files
    warm = provider_for(storage)
    state_of(warm, v1)
    assert state_of(warm, v3) == {"a": 1}  # the cached version 1 is version 3's state
    assert warm.get_read_store(3, v3.checkpoint_id).metrics.load.source.value == "cache"
    assert state_of(warm, v4) == {"b": 2}  # rolls forward over versions 2 and 3
    assert provider_for(storage).read_delta(v3.ref).num_rows == 0
    assert provider_for(storage).read_delta(v4.ref).num_rows == 2
    v6 = commit_rows(provider_for(storage), v5, {"c": 3})  # a cold writer goes on
    assert v6.lineage[:3] == (v5.ref, v4.ref, v3.ref)
    assert state_of(provider_for(storage), v6) == {"b": 2, "c": 3}


def test_a_snapshot_of_a_version_without_a_file_and_cleanup(storage: Storage) -> None:
    writer = provider_for(storage)
    infos = [commit_rows(writer, None, {"a": 1})]
    for puts in ({"b": 2}, {}, {"c": 3}, {}, {}):
        infos.append(commit_rows(writer, infos[-1], puts))
    snap = provider_for(storage).snapshot(5, infos[4].checkpoint_id)
    assert snap.path.endswith(f"5_{infos[4].checkpoint_id}.snapshot")
    plan = cleanup(provider_for(storage), infos[-1].ref, min_age=timedelta(0), dry_run=False)
    # versions 6 and 5 load from the snapshot at 5: the deltas of 1, 2 and 4 are superseded
    assert sorted(plan.deleted) == sorted(infos[i].path for i in (0, 1, 3))
    assert state_of(provider_for(storage), infos[-1]) == {"a": 1, "b": 2, "c": 3}


def test_a_lost_delta_is_not_taken_for_an_idle_version(storage: Storage) -> None:
    """Only a version that keeps its parent's id has no file; a missing delta (a fresh id
    found nowhere else) stays a broken lineage, typed and naming the file."""
    writer = provider_for(storage)
    v1 = commit_rows(writer, None, {"a": 1})
    v2 = commit_rows(writer, v1, {"b": 2})
    v3 = commit_rows(writer, v2, {"c": 3})
    v4 = commit_rows(writer, v3, {})
    storage.delete([v2.path])
    with pytest.raises(CannotLoadState) as err:
        provider_for(storage).get_read_store(4, v4.checkpoint_id)
    assert err.value.path == v2.path
    storage.delete([v3.path])  # the file version 4 shares its id with is gone too
    with pytest.raises(CannotLoadState) as err:
        provider_for(storage).get_read_store(4, v4.checkpoint_id)
    assert err.value.version == 4


def test_roll_forward_walks_over_a_version_without_a_file(storage: Storage) -> None:
    """Cached at version 1; version 3 changed nothing on 2: loading 4 reads deltas 4 and 2
    only (the missing delta 3 is proved idle by delta 2's id) and applies them."""
    writer = provider_for(storage)
    v1 = commit_rows(writer, None, {"a": 1})
    v2 = commit_rows(writer, v1, {"b": 2})
    v3 = commit_rows(writer, v2, {})
    v4 = commit_rows(writer, v3, {"c": 3})
    behind = provider_for(storage)
    state_of(behind, v1)
    store = behind.get_read_store(4, v4.checkpoint_id)
    assert store.metrics.load.source.value == "roll_forward"
    assert store.metrics.load.deltas_applied == 2
    assert {k[0] for k, _ in store.items()} == {"a", "b", "c"}
    v5 = commit_rows(behind, v4, {"d": 4})
    assert v5.lineage == (v4.ref, v3.ref, v2.ref, v1.ref)
