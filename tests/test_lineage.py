"""Loading by (version, checkpoint id) as in SPARK-49374's examples 1 to 3, and concurrency."""

from __future__ import annotations

import threading

import pytest

from state_runtime import FileKind, LoadSource
from state_runtime.errors import CannotLoadState, InvalidArgument
from state_runtime.storage import Storage

from .store_helpers import commit_rows, provider_for, state_of


def _files(storage: Storage) -> set[str]:
    return {f.path.rsplit("/", 1)[-1] for f in storage.list("state")}


def test_example_1_a_snapshot_of_the_id_is_used_directly(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = commit_rows(p, v1, {"b": 2})
    v3 = commit_rows(p, v2, {"c": 3})
    provider_for(storage).snapshot(3, v3.checkpoint_id)
    fresh = provider_for(storage)
    store = fresh.get_read_store(3, v3.checkpoint_id)
    assert (store.metrics.load.files_read, store.metrics.load.deltas_applied) == (1, 0)
    assert {k[0] for k, _ in store.items()} == {"a", "b", "c"}


def test_example_2_only_a_delta_other_ids_at_the_version_are_ignored(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    provider_for(storage).snapshot(1, v1.checkpoint_id)
    v2 = commit_rows(p, v1, {"b": 2})
    v3 = commit_rows(p, v2, {"c": 3})
    # Another attempt at version 3 (speculative task) got a snapshot too.
    other = commit_rows(provider_for(storage), v2, {"zombie": 9})
    provider_for(storage).snapshot(3, other.checkpoint_id)
    fresh = provider_for(storage)
    store = fresh.get_read_store(3, v3.checkpoint_id)
    # 1_<id>.snapshot + 2 deltas; the other attempt's snapshot and delta are not read.
    assert (store.metrics.load.files_read, store.metrics.load.deltas_applied) == (3, 2)
    assert {k[0] for k, _ in store.items()} == {"a", "b", "c"}


def test_example_3_a_missing_presumed_snapshot_is_traced_through_its_delta(
    storage: Storage,
) -> None:
    p = provider_for(storage, min_deltas_for_snapshot=2)
    infos = [commit_rows(p, None, {"k0": 0})]
    for i in range(1, 6):
        infos.append(commit_rows(p, infos[-1], {f"k{i}": i}))
    v6 = infos[-1]
    # Lineage in files is cut at the presumed snapshot (2 entries back), none was written.
    assert [r.version for r in v6.lineage] == [5, 4]
    assert not any(name.endswith(".snapshot") for name in _files(storage))
    fresh = provider_for(storage, min_deltas_for_snapshot=2)
    store = fresh.get_read_store(6, v6.checkpoint_id)
    assert store.metrics.load.deltas_applied == 6
    assert {k[0]: v[0] for k, v in store.items()} == {f"k{i}": i for i in range(6)}


def test_lineage_restarts_at_a_known_snapshot(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = commit_rows(p, v1, {"b": 2})
    p.snapshot(2, v2.checkpoint_id)
    v3 = commit_rows(p, v2, {"c": 3})
    assert v3.lineage == (v2.ref,)
    v4 = commit_rows(p, v3, {"d": 4})
    assert v4.lineage == (v3.ref, v2.ref)


def test_two_instances_writing_the_same_version_never_collide(storage: Storage) -> None:
    v1 = commit_rows(provider_for(storage), None, {"a": 1})
    results = {}
    barrier = threading.Barrier(2)

    def attempt(name: str, value: int) -> None:
        p = provider_for(storage)
        store = p.get_store(1, v1.checkpoint_id)
        store.put("a", value)
        barrier.wait()
        results[name] = store.commit()

    threads = [threading.Thread(target=attempt, args=(n, v)) for n, v in (("x", 10), ("y", 20))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    x, y = results["x"], results["y"]
    assert x.version == y.version == 2 and x.checkpoint_id != y.checkpoint_id
    assert state_of(provider_for(storage), x) == {"a": 10}
    assert state_of(provider_for(storage), y) == {"a": 20}


def test_a_zombie_writing_late_does_not_change_the_committed_version(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    zombie = provider_for(storage).get_store(1, v1.checkpoint_id)  # opened, then stalls
    winner = commit_rows(p, v1, {"a": 2})
    v3 = commit_rows(p, winner, {"b": 3})  # the stream moves on
    zombie.put("a", 666)
    late = zombie.commit()  # writes 2_<its own id>.delta after the fact
    assert late.version == 2 and late.path != winner.path
    fresh = provider_for(storage)
    assert state_of(fresh, winner) == {"a": 2}
    assert state_of(fresh, v3) == {"a": 2, "b": 3}
    assert state_of(provider_for(storage), late) == {"a": 666}  # still its own lineage
    assert storage.exists(late.path) and storage.exists(winner.path)


def test_loading_by_the_committed_id_returns_the_committed_data(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    attempts = [commit_rows(provider_for(storage), v1, {"a": n}) for n in range(5)]
    committed = attempts[3]  # the driver picked this one
    follower = commit_rows(provider_for(storage), committed, {"b": 1})
    fresh = provider_for(storage)
    assert state_of(fresh, follower) == {"a": 3, "b": 1}
    store = fresh.get_read_store(2, committed.checkpoint_id)
    assert store.get("a") == (3,)
    assert store.metrics.load.source in {LoadSource.CACHE, LoadSource.FILES}


def test_snapshot_is_idempotent_and_never_overwrites(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    first = p.snapshot(1, v1.checkpoint_id)
    second = provider_for(storage).snapshot(1, v1.checkpoint_id)
    assert first.kind is FileKind.SNAPSHOT and first.bytes_written > 0
    assert second.bytes_written == 0 and second.checksum == first.checksum
    assert second.path == first.path


def test_a_snapshot_as_a_lower_version_of_the_same_id(storage: Storage) -> None:
    """A version that changed nothing shares its parent's id and state: the state of version
    2 is written as version 1's own snapshot (what a restore does for the expired base of a
    replay), version 1 then loads from it, and a new version 2 commits on it."""
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = commit_rows(p, v1, {})
    assert v2.checkpoint_id == v1.checkpoint_id  # an idle version: no file of its own
    p.snapshot(2, v2.checkpoint_id)
    storage.delete([v1.path])  # cleanup took the delta the snapshot superseded
    with pytest.raises(CannotLoadState):
        provider_for(storage).get_read_store(1, v1.checkpoint_id)
    with pytest.raises(InvalidArgument):
        provider_for(storage).snapshot(2, v2.checkpoint_id, as_version=3)
    info = provider_for(storage).snapshot(2, v2.checkpoint_id, as_version=1)
    assert (info.kind, info.version, info.checkpoint_id) == (
        FileKind.SNAPSHOT,
        1,
        v1.checkpoint_id,
    )
    fresh = provider_for(storage)
    assert state_of(fresh, v1) == {"a": 1}
    replayed = commit_rows(fresh, v1, {"b": 2})
    assert state_of(provider_for(storage), replayed) == {"a": 1, "b": 2}
