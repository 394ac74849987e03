"""Real bad input: truncated, corrupt, mislabelled and missing files, bad names and versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_runtime import LoadSource, StateStoreProvider
from state_runtime.errors import (
    CannotLoadState,
    CheckpointFileCorrupt,
    InvalidArgument,
    LineageBroken,
    UnexpectedVersion,
    UnknownCheckpointId,
)
from state_runtime.identity import StoreId, new_checkpoint_id
from state_runtime.storage import LocalStorage, Storage, open_storage

from .store_helpers import KEY, VALUE, commit_rows, provider_for, state_of


def _replace(storage: Storage, path: str, data: bytes) -> None:
    """Overwrite a file behind the store's back (the store itself never does)."""
    storage.delete([path])
    storage.write_if_absent(path, data)


def _three_versions(storage: Storage):  # type: ignore[no-untyped-def]
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = commit_rows(p, v1, {"b": 2})
    v3 = commit_rows(p, v2, {"c": 3})
    return v1, v2, v3


def test_truncated_delta(storage: Storage) -> None:
    _, _, v3 = _three_versions(storage)
    data = storage.read(v3.path)
    for cut in (10, len(data) // 2, len(data) - 1):
        _replace(storage, v3.path, data[:cut])
        with pytest.raises(CheckpointFileCorrupt, match="truncated") as err:
            provider_for(storage).get_read_store(3, v3.checkpoint_id)
        assert err.value.path == v3.path and v3.path in str(err.value)
        assert err.value.version == 3 and err.value.store == StoreId(0, 0)


def test_flipped_bytes_fail_the_checksum(storage: Storage) -> None:
    _, v2, v3 = _three_versions(storage)
    data = bytearray(storage.read(v2.path))
    data[len(data) // 2] ^= 0xFF
    _replace(storage, v2.path, bytes(data))
    with pytest.raises(CheckpointFileCorrupt, match="checksum mismatch") as err:
        provider_for(storage).get_read_store(3, v3.checkpoint_id)
    assert err.value.path == v2.path


def test_not_a_checkpoint_file(storage: Storage) -> None:
    v1, _, _ = _three_versions(storage)
    _replace(storage, v1.path, b"PAR1" + b"\x00" * 100)
    with pytest.raises(CheckpointFileCorrupt, match="bad magic"):
        provider_for(storage).get_read_store(1, v1.checkpoint_id)


def test_another_stores_file_renamed_into_place(storage: Storage) -> None:
    _, _, v3 = _three_versions(storage)
    other = commit_rows(provider_for(storage, partition=7), None, {"x": 1})
    _replace(storage, v3.path, storage.read(other.path))
    with pytest.raises(UnexpectedVersion, match="store 0/7/default") as err:
        provider_for(storage).get_read_store(3, v3.checkpoint_id)
    assert err.value.path == v3.path


def test_version_in_the_name_not_matching_the_content(storage: Storage) -> None:
    _, v2, v3 = _three_versions(storage)
    _replace(storage, v3.path, storage.read(v2.path))
    with pytest.raises(UnexpectedVersion, match="version 2"):
        provider_for(storage).get_read_store(3, v3.checkpoint_id)


def test_missing_middle_delta_names_the_file(storage: Storage) -> None:
    _, v2, v3 = _three_versions(storage)
    storage.delete([v2.path])
    with pytest.raises(LineageBroken) as err:
        provider_for(storage).get_read_store(3, v3.checkpoint_id)
    assert err.value.path == v2.path and "missing" in str(err.value)


def test_missing_presumed_snapshot_with_intact_deltas_loads(storage: Storage) -> None:
    p = provider_for(storage, min_deltas_for_snapshot=1)
    infos = [commit_rows(p, None, {"a": 1})]
    for i in range(4):
        infos.append(commit_rows(p, infos[-1], {f"k{i}": i}))
    assert len(infos[-1].lineage) == 1  # presumes a snapshot at version 4 that never came
    assert state_of(provider_for(storage), infos[-1]) == {
        "a": 1,
        "k0": 0,
        "k1": 1,
        "k2": 2,
        "k3": 3,
    }


def test_corrupt_snapshot_falls_back_to_deltas_and_reports_the_repair(storage: Storage) -> None:
    _, v2, v3 = _three_versions(storage)
    snap = provider_for(storage).snapshot(2, v2.checkpoint_id)
    data = bytearray(storage.read(snap.path))
    data[-5] ^= 0x01
    _replace(storage, snap.path, bytes(data))
    store = provider_for(storage).get_read_store(3, v3.checkpoint_id)
    assert {k[0] for k, _ in store.items()} == {"a", "b", "c"}
    assert len(store.metrics.load.repairs) == 1
    assert snap.path in store.metrics.load.repairs[0]


def test_corrupt_snapshot_without_a_way_around_is_a_typed_error(storage: Storage) -> None:
    v1, v2, v3 = _three_versions(storage)
    snap = provider_for(storage).snapshot(2, v2.checkpoint_id)
    storage.delete([v1.path])  # the fallback path is gone too
    _replace(storage, snap.path, storage.read(snap.path)[:-3])
    with pytest.raises(CheckpointFileCorrupt) as err:
        provider_for(storage).get_read_store(3, v3.checkpoint_id)
    assert err.value.path == snap.path


@pytest.mark.parametrize("damaged_version", [3, 2])
def test_a_cached_copy_passes_over_a_corrupt_delta_a_snapshot_replaces(
    storage: Storage, damaged_version: int
) -> None:
    """A provider caching version 1 loads version 3 as a fresh one does: through version 3's
    snapshot (its own delta corrupt) or version 2's (the parent's delta corrupt), never
    failing on a delta the snapshot replaces (found by the simulation: a repartition's warm
    worker failed on it where every load from files succeeded); the repair names the file."""
    versions = _three_versions(storage)
    behind = provider_for(storage)
    assert state_of(behind, versions[0]) == {"a": 1}  # behind caches version 1
    damaged = versions[damaged_version - 1]
    provider_for(storage).snapshot(damaged_version, damaged.checkpoint_id)
    data = bytearray(storage.read(damaged.path))
    data[len(data) // 2] ^= 0xFF
    _replace(storage, damaged.path, bytes(data))
    assert state_of(provider_for(storage), versions[2]) == {"a": 1, "b": 2, "c": 3}
    store = behind.get_read_store(3, versions[2].checkpoint_id)
    assert {k[0]: v[0] for k, v in store.items()} == {"a": 1, "b": 2, "c": 3}
    assert store.metrics.load.source is LoadSource.FILES
    assert [r for r in store.metrics.load.repairs if damaged.path in r]


def test_a_cached_copy_fails_on_a_corrupt_delta_as_a_fresh_load_does(storage: Storage) -> None:
    """Without a snapshot around it, a corrupt delta fails a warm load with the same typed
    error, naming the same file, as a load from files."""
    v1, v2, v3 = _three_versions(storage)
    behind = provider_for(storage)
    assert state_of(behind, v1) == {"a": 1}
    data = bytearray(storage.read(v2.path))
    data[len(data) // 2] ^= 0xFF
    _replace(storage, v2.path, bytes(data))
    with pytest.raises(CheckpointFileCorrupt, match="checksum mismatch") as err:
        behind.get_read_store(3, v3.checkpoint_id)
    assert err.value.path == v2.path


def test_negative_version_and_unknown_id(storage: Storage) -> None:
    _three_versions(storage)
    p = provider_for(storage)
    with pytest.raises(InvalidArgument, match="version -1"):
        p.get_store(-1)
    unknown = new_checkpoint_id()
    with pytest.raises(UnknownCheckpointId) as err:
        p.get_store(2, unknown)
    assert err.value.checkpoint_id == unknown and err.value.version == 2
    with pytest.raises(InvalidArgument, match="checkpoint id"):
        p.get_store(2, "../../etc/passwd")
    with pytest.raises(InvalidArgument):
        p.get_store(0, unknown)


def test_no_bad_file_ever_returns_wrong_data(storage: Storage) -> None:
    """Every single-byte corruption of a delta is either detected or harmless."""
    _, _, v3 = _three_versions(storage)
    good = storage.read(v3.path)
    offsets = [*range(52), *range(52, len(good), max(1, len(good) // 40))]
    for offset in offsets:
        bad = bytearray(good)
        bad[offset] ^= 0x55
        _replace(storage, v3.path, bytes(bad))
        with pytest.raises(CannotLoadState):
            provider_for(storage).get_read_store(3, v3.checkpoint_id)
    _replace(storage, v3.path, good)
    assert state_of(provider_for(storage), v3) == {"a": 1, "b": 2, "c": 3}


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../x", "x" * 200, "a b", "ok/.."])
def test_bad_store_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgument):
        StateStoreProvider(tmp_path, 0, 0, name, key_schema=KEY, value_schema=VALUE)


@pytest.mark.parametrize("root", ["", "/tmp/../etc", "relative/../../up", "ftp://host/x"])
def test_bad_roots_are_refused(root: str) -> None:
    with pytest.raises(InvalidArgument):
        open_storage(root)


def test_storage_paths_cannot_escape_the_root(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    for path in ("../x", "/etc/passwd", "a//b", "a/./b", "a\\b", ""):
        with pytest.raises(InvalidArgument):
            storage.read(path)
        with pytest.raises(InvalidArgument):
            storage.write_if_absent(path, b"x")


def test_bad_ids_and_partitions() -> None:
    with pytest.raises(InvalidArgument):
        StoreId(-1, 0)
    with pytest.raises(InvalidArgument):
        StoreId(0, True)  # type: ignore[arg-type]
