"""A cold load under a small budget streams a large delta into a change run on local disk, a
record batch at a time, as it streams a large snapshot, from local files and from S3 (moto):
the state then equals a whole read's, a delta written in one batch still loads, and a
damaged delta is refused with the typed error a whole read gives, leaving no run file behind
(issue 37, docs/state-on-disk.md)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.errors import CheckpointFileCorrupt
from state_runtime.identity import FileKind
from state_runtime.storage import Storage
from state_runtime.store import checkpoint_format, loader
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun

from .store_helpers import forced_disk, provider_for

ROWS = 6000
Key = Callable[[int], tuple[object, ...]]


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files in record batches of a few hundred rows, as a large delta has them."""
    monkeypatch.setattr(checkpoint_format, "BATCH_BYTES", 8192)


@pytest.fixture
def streamed_kinds(monkeypatch: pytest.MonkeyPatch) -> list[FileKind]:
    """The kinds of the files the loader reads as a stream, in order."""
    kinds: list[FileKind] = []
    read = loader.read_streamed

    def spy(*args: object, **kwargs: object) -> object:
        kinds.append(kwargs["kind"])  # type: ignore[arg-type]
        return read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "read_streamed", spy)
    return kinds


def _fresh(storage: Storage, keys: str) -> StateStoreProvider:
    if keys == "integer":
        return StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")
    return provider_for(storage)


def _key(keys: str) -> Key:
    if keys == "integer":
        return lambda i: (i,)
    return lambda i: (f"user-{i:06d}",)


def _deltas(provider: StateStoreProvider, key: Key) -> CheckpointInfo:
    """Two large deltas and no snapshot: puts, then updates, removals and a new key."""
    store = provider.get_store(0)
    for i in range(ROWS):
        store.put(key(i), (i * 7,))
    first = store.commit()
    store = provider.get_store(first.version, first.checkpoint_id)
    for i in range(0, ROWS, 3):
        store.put(key(i), (-i,))
    for i in range(1, ROWS, 5):
        store.remove(key(i))
    store.put(key(ROWS + 1), (1,))
    return store.commit()


def _format(storage: Storage, info: CheckpointInfo) -> int:
    return int.from_bytes(storage.read(info.path)[8:10], "little")


@pytest.mark.parametrize("keys", ["integer", "string"])
def test_a_large_delta_streams_to_disk_and_loads_as_a_whole_read(
    storage: Storage, keys: str, streamed_kinds: list[FileKind]
) -> None:
    """A small delta (format 3, read whole) on top of two large ones (format 2, streamed)."""
    key = _key(keys)
    provider = _fresh(storage, keys)
    large = _deltas(provider, key)
    assert _format(storage, large) == 2  # more rows than a batch: record batches
    store = provider.get_store(*_ref(large))
    store.put(key(0), (5,))
    last = store.commit()
    assert _format(storage, last) == 3
    whole = _fresh(storage, keys).get_read_store(last.version, last.checkpoint_id)
    expected = dict(whole.items())
    assert not streamed_kinds
    with forced_disk(block_bytes=4096):
        streamed = _fresh(storage, keys).get_read_store(last.version, last.checkpoint_id)
        assert streamed_kinds == [FileKind.DELTA, FileKind.DELTA]
        assert any(isinstance(run, DiskRun) for run in streamed._version.runs)  # type: ignore[attr-defined]
        assert streamed.metrics.load.deltas_applied == 3
        lineage = streamed._version.lineage  # type: ignore[attr-defined]
        assert lineage == whole._version.lineage  # type: ignore[attr-defined]
        assert [ref.version for ref in lineage] == [2, 1]
        assert streamed.metrics.rows == whole.metrics.rows == len(expected)
        assert dict(streamed.items()) == expected
        probes = [key(i) for i in range(0, ROWS + 3, 7)]
        assert [streamed.get(p) for p in probes] == [whole.get(p) for p in probes]


def test_a_delta_written_in_one_batch_still_loads(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, streamed_kinds: list[FileKind]
) -> None:
    """As every delta was written before (format 3, one body): read whole."""
    monkeypatch.setattr(checkpoint_format, "BATCH_BYTES", 1 << 30)
    last = _deltas(_fresh(storage, "integer"), _key("integer"))
    assert _format(storage, last) == 3
    expected = dict(_fresh(storage, "integer").get_read_store(*_ref(last)).items())
    with forced_disk(block_bytes=4096):
        loaded = _fresh(storage, "integer").get_read_store(*_ref(last))
        assert dict(loaded.items()) == expected
    assert not streamed_kinds


def _ref(info: CheckpointInfo) -> tuple[int, str]:
    assert info.checkpoint_id is not None
    return info.version, info.checkpoint_id


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("flip", "checksum mismatch"), ("truncate", "truncated or extended")],
)
def test_a_damaged_delta_is_refused_while_streamed_and_leaves_no_run(
    storage: Storage, damage: str, reason: str, streamed_kinds: list[FileKind]
) -> None:
    last = _deltas(_fresh(storage, "integer"), _key("integer"))
    data = bytearray(storage.read(last.path))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[-100:]
    storage.delete([last.path])
    storage.write_if_absent(last.path, bytes(data))
    gc.collect()
    before = LOCAL_DISK.stats.local_disk_bytes
    with forced_disk(block_bytes=4096), pytest.raises(CheckpointFileCorrupt, match=reason) as e:
        _fresh(storage, "integer").get_read_store(*_ref(last))
    assert e.value.path == last.path
    assert streamed_kinds == [FileKind.DELTA]
    del e
    gc.collect()
    assert LOCAL_DISK.stats.local_disk_bytes == before


def _wider(storage: Storage) -> StateStoreProvider:
    return StateStoreProvider(
        storage, 0, 0, key_schema="k bigint", value_schema="v bigint, last string"
    )


@pytest.mark.parametrize("streamed", [[FileKind.DELTA, FileKind.DELTA], [FileKind.SNAPSHOT]])
def test_large_files_written_before_a_nullable_column_was_appended_stream_under_it(
    storage: Storage, streamed: list[FileKind], streamed_kinds: list[FileKind]
) -> None:
    """Rows of format 2 deltas (or of a snapshot) streamed to disk read under the widened
    schema (the new column null), as a whole read gives them."""
    large = _deltas(_fresh(storage, "integer"), _key("integer"))
    assert _format(storage, large) == 2
    if streamed == [FileKind.SNAPSHOT]:
        _fresh(storage, "integer").snapshot(*_ref(large))
    store = _wider(storage).get_store(*_ref(large))
    store.put((0,), (5, "x"))
    last = store.commit()
    expected = dict(_wider(storage).get_read_store(*_ref(last)).items())
    assert expected[(3,)] == (-3, None) and expected[(0,)] == (5, "x")
    assert not streamed_kinds
    with forced_disk(block_bytes=4096):
        loaded = _wider(storage).get_read_store(*_ref(last))
        assert streamed_kinds == streamed
        assert any(isinstance(run, DiskRun) for run in loaded._version.runs)  # type: ignore[attr-defined]
        assert dict(loaded.items()) == expected
        assert loaded.get((2,)) == (14, None)


LARGE = 100_000


def _rows(keys: np.ndarray, values: np.ndarray | None) -> pa.Table:
    """Rows in the checkpoint layout (``values`` None: removals)."""
    value = (
        pa.array(values, type=pa.int64()) if values is not None else pa.nulls(len(keys), pa.int64())
    )
    key_struct = pa.StructArray.from_arrays([pa.array(keys, type=pa.int64())], names=["k"])
    value_struct = pa.StructArray.from_arrays(
        [value], names=["v"], mask=pa.array(np.full(len(keys), values is None))
    )
    return pa.table({"key": key_struct, "value": value_struct})


def test_small_deltas_of_many_rows_and_removals_stream_under_a_real_threshold(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, streamed_kinds: list[FileKind]
) -> None:
    """A 4 MiB budget's threshold (1 MiB), not a tiny one: two deltas stored in a few KB
    (consecutive keys, runs of equal values) decode to more than it, so they are streamed from
    their bytes (``snapshot_stream.decodes_large``), removals included, and the state equals
    a whole read's."""
    monkeypatch.setattr(checkpoint_format, "BATCH_BYTES", 1 << 20)  # as written by default
    provider = _fresh(storage, "integer")
    store = provider.get_store(0)
    keys = np.arange(LARGE, dtype=np.int64)
    store.apply_arrow(_rows(keys, np.ones(LARGE, dtype=np.int64)))
    first = store.commit()
    store = provider.get_store(*_ref(first))
    kept = keys[keys % 5 != 1]
    store.apply_arrow(_rows(kept, np.where(kept % 3 == 0, 2, 1)))  # every row again: 1.6 MB
    store.apply_arrow(_rows(keys[1::5], None))
    last = store.commit()
    threshold = 1 << 20
    for info in (first, last):
        size = len(storage.read(info.path))
        assert _format(storage, info) == 2 and size * 8 <= threshold, size  # not streamed by size
    whole = _fresh(storage, "integer").get_read_store(*_ref(last))
    expected = dict(whole.items())
    assert len(expected) == LARGE - len(keys[1::5])
    assert expected[(3,)] == (2,) and (1,) not in expected and expected[(2,)] == (1,)
    assert not streamed_kinds
    monkeypatch.setattr(LOCAL_DISK, "spill_bytes", threshold)
    loaded = _fresh(storage, "integer").get_read_store(*_ref(last))
    assert streamed_kinds == [FileKind.DELTA, FileKind.DELTA]
    assert any(isinstance(run, DiskRun) for run in loaded._version.runs)  # type: ignore[attr-defined]
    assert loaded.metrics.rows == len(expected)
    assert dict(loaded.items()) == expected
    probes = [(i,) for i in range(0, LARGE + 3, 7)]
    assert [loaded.get(p) for p in probes] == [whole.get(p) for p in probes]
