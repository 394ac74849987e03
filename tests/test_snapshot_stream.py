"""A cold start under a small budget streams the snapshot into a run on local disk, a record
batch at a time, from local files and from S3 (moto): the state then answers exactly as a
whole load does, and a damaged snapshot is refused as a whole read refuses it, leaving no
run file behind (issue 37, docs/state-on-disk.md)."""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.errors import CheckpointFileCorrupt, FileAlreadyExists, StorageFileNotFound
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.storage import Storage
from state_runtime.store import checkpoint_format, run_builder, snapshot_stream
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun

from .s3_fixtures import MotoS3
from .store_helpers import forced_disk, provider_for

ROWS = 6000
MIB = 1 << 20


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
    for i in range(0, ROWS, 7):
        store.put(key(i), (-i,))  # type: ignore[operator]
    for i in range(1, ROWS, 11):
        store.remove(key(i))  # type: ignore[operator]
    store.put(key(ROWS + 1), (1,))  # type: ignore[operator]
    return first, store.commit()


@pytest.mark.parametrize("fan_in", [run_builder.FAN_IN, 2])
@pytest.mark.parametrize("keys", ["integer", "string"])
def test_a_cold_start_streams_the_snapshot_to_disk_and_answers_as_a_whole_load(
    storage: Storage, keys: str, fan_in: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """String keys come in key order, not index order: one stretch per batch, merged
    ``fan_in`` at a time (2: several levels)."""
    monkeypatch.setattr(run_builder, "FAN_IN", fan_in)

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


@pytest.mark.parametrize("keys", ["integer", "string"])
def test_a_snapshot_of_runs_on_disk_is_streamed_and_reads_back_equal(
    storage: Storage, keys: str
) -> None:
    def key(i: int) -> tuple[object, ...]:
        return (i,) if keys == "integer" else (f"user-{i:06d}",)

    def fresh() -> StateStoreProvider:
        return _int_provider(storage) if keys == "integer" else provider_for(storage)

    with forced_disk(block_bytes=4096):
        provider = fresh()
        first, last = _build(provider, key)
        view = provider.get_read_store(last.version, last.checkpoint_id)._version  # type: ignore[attr-defined]
        assert all(run.on_disk for run in view.runs) and len(view.runs) == 2
        info = provider.snapshot(last.version, last.checkpoint_id)
        again = provider.snapshot(last.version, last.checkpoint_id)
    data = storage.read(info.path)
    assert info.checksum == checkpoint_format.checksum(data) == again.checksum
    assert (info.bytes_written, again.bytes_written) == (len(data), 0)
    assert (info.rows, info.file_rows, info.lineage) == (last.rows, last.rows, last.lineage)
    assert info.kind is FileKind.SNAPSHOT
    header, table = checkpoint_format.decode(data, info.path)
    assert (header.file_rows, header.state_rows, header.lineage) == (
        last.rows,
        last.rows,
        last.lineage,
    )
    whole = fresh()  # no delta: the snapshot alone, read whole
    storage.delete([last.path])
    state = whole.get_read_store(last.version, last.checkpoint_id)
    assert state.metrics.load.deltas_applied == 0
    expected = {key(i): (i * 7,) for i in range(ROWS)}
    expected.update({key(i): (-i,) for i in range(0, ROWS, 7)})
    for i in range(1, ROWS, 11):
        expected.pop(key(i))
    expected[key(ROWS + 1)] = (1,)
    assert dict(state.items()) == expected
    assert table.num_rows == len(expected)
    with forced_disk(block_bytes=4096):
        streamed = fresh().get_read_store(last.version, last.checkpoint_id)
        assert dict(streamed.items()) == expected
    del first


def test_a_streamed_write_to_s3_is_a_multipart_upload_of_parts_read_one_by_one(
    moto_s3: MotoS3,
) -> None:
    storage = moto_s3.storage(multipart_threshold=MIB, multipart_part_size=5 * MIB)
    data = np.random.default_rng(3).bytes(11 * MIB)
    storage.requests.reset()
    storage.write_stream_if_absent("a/big.bin", io.BytesIO(data), len(data))
    assert storage.read("a/big.bin") == data
    assert storage.requests.counts["multipart"] == 2 + 3
    with pytest.raises(FileAlreadyExists):
        storage.write_stream_if_absent("a/big.bin", io.BytesIO(data), len(data))
    assert moto_s3.pending_uploads(storage.bucket) == []


def test_a_snapshot_read_whole_has_its_header_parsed_once(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deciding whether a file read whole is still streamed (by its rows) parses its header;
    the decode then takes that header, not a second parse (38 to 63 us a file)."""
    provider, ref, _ = _snapshot_path(storage)
    parsed = []
    parse = checkpoint_format.stream_header

    def spy(schema: object, fmt: int) -> object:
        parsed.append(fmt)
        return parse(schema, fmt)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint_format, "stream_header", spy)
    monkeypatch.setattr(snapshot_stream, "stream_header", spy)
    loaded = _int_provider(storage).get_read_store(ref.version, ref.checkpoint_id)
    assert parsed == [2]  # the snapshot, format 2, once
    assert dict(loaded.items()) == dict(
        provider.get_read_store(ref.version, ref.checkpoint_id).items()
    )
