"""A cold start under a small budget streams the snapshot into a run on local disk, a record
batch at a time, from local files and from S3 (moto): the state then answers exactly as a
whole load does, and a damaged snapshot is refused as a whole read refuses it, leaving no
run file behind (issue 37, docs/state-on-disk.md)."""

from __future__ import annotations

import gc

import pytest

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.errors import CheckpointFileCorrupt, StorageFileNotFound
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.storage import Storage
from state_runtime.store import checkpoint_format
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun

from .store_helpers import forced_disk, provider_for

ROWS = 6000


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots in record batches of a few hundred rows, as a large state has them."""
    monkeypatch.setattr(checkpoint_format, "BATCH_BYTES", 8192)


def _int_provider(storage: Storage) -> StateStoreProvider:
    return StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")


def _build(provider: StateStoreProvider, key: object) -> tuple[CheckpointInfo, CheckpointInfo]:
    """Two versions and a snapshot of the first; the second is a delta on top of it."""
    store = provider.get_store(0)
    for i in range(ROWS):
        store.put(key(i), (i * 7,))  # type: ignore[operator]
    first = store.commit()
    provider.snapshot(first.version, first.checkpoint_id)
    store = provider.get_store(first.version, first.checkpoint_id)
    for i in range(0, ROWS, 5):
        store.put(key(i), (-i,))  # type: ignore[operator]
    for i in range(1, ROWS, 11):
        store.remove(key(i))  # type: ignore[operator]
    store.put(key(ROWS + 1), (1,))  # type: ignore[operator]
    return first, store.commit()


@pytest.mark.parametrize("keys", ["integer", "string"])
def test_a_cold_start_streams_the_snapshot_to_disk_and_answers_as_a_whole_load(
    storage: Storage, keys: str
) -> None:
    def key(i: int) -> tuple[object, ...]:
        return (i,) if keys == "integer" else (f"user-{i:06d}",)

    def fresh() -> StateStoreProvider:
        return _int_provider(storage) if keys == "integer" else provider_for(storage)

    _, last = _build(fresh(), key)
    whole = fresh().get_read_store(last.version, last.checkpoint_id)
    expected = dict(whole.items())
    with forced_disk(block_bytes=4096):
        streamed = fresh().get_read_store(last.version, last.checkpoint_id)
        view = streamed._version  # type: ignore[attr-defined]
        assert any(isinstance(run, DiskRun) for run in view.runs)
        assert streamed.metrics.load.deltas_applied == 1
        assert dict(streamed.items()) == expected
        probes = [key(i) for i in range(0, ROWS + 3, 3)]
        assert [streamed.get(p) for p in probes] == [whole.get(p) for p in probes]
        assert streamed.to_arrow().sort_by("key").equals(whole.to_arrow().sort_by("key"))
        low, high = key(100), key(900)
        assert list(streamed.range_scan(low, high)) == list(whole.range_scan(low, high))


def _snapshot_path(storage: Storage) -> tuple[StateStoreProvider, CheckpointRef, str]:
    provider = _int_provider(storage)
    first, _ = _build(provider, lambda i: (i,))
    ref = CheckpointRef(first.version, first.checkpoint_id)
    assert first.checkpoint_id is not None
    return (
        provider,
        ref,
        provider.store_id.file_path(ref.version, first.checkpoint_id, FileKind.SNAPSHOT),
    )


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "checksum mismatch"),
        ("truncate", "truncated or extended"),
        ("extend", "truncated or extended"),
    ],
)
def test_a_damaged_snapshot_is_refused_while_streamed_and_leaves_no_run(
    storage: Storage, damage: str, reason: str
) -> None:
    provider, ref, path = _snapshot_path(storage)
    data = bytearray(storage.read(path))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        del data[-100:]
    else:
        data += b"\0"
    storage.delete([path])
    storage.write_if_absent(path, bytes(data))
    before = LOCAL_DISK.stats.local_disk_bytes
    with forced_disk(block_bytes=4096), pytest.raises(CheckpointFileCorrupt, match=reason):
        _int_provider(storage).read_header(ref, FileKind.SNAPSHOT)
    gc.collect()
    assert LOCAL_DISK.stats.local_disk_bytes == before
    del provider


def test_read_stream_gives_the_file_in_pieces_and_counts_its_bytes(storage: Storage) -> None:
    data = bytes(range(256)) * 4000
    storage.write_if_absent("a/f.bin", data)
    storage.requests.reset()
    with storage.read_stream("a/f.bin") as stream:
        pieces = [stream.read(10_000) for _ in range(110)]
    assert b"".join(pieces) == data and pieces[-1] == b""
    assert storage.requests.bytes_read == len(data)
    with pytest.raises(StorageFileNotFound), storage.read_stream("a/missing.bin"):
        pass
