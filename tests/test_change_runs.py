"""A batch of many ``apply_arrow`` calls under a small budget (issue 37): the changes past
the spill threshold go to local disk as they arrive, not squashed in memory at commit.
In process, with a threshold of a few calls' rows: lookups, the row count, ``updates()``,
the delta's row count and the committed version all equal the same calls made with every run in
memory, removals and keys changed twice included; a small batch still writes format 3; a
spill onto a full local disk fails typed.
The memory bound itself is measured in a fresh process (tests/test_delta_write.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from state_runtime import StateStoreProvider
from state_runtime.errors import LocalDiskFull
from state_runtime.storage import LocalStorage
from state_runtime.store import checkpoint_format
from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun

from .store_helpers import int_table, local_tmpfs

THRESHOLD = 100_000  # bytes: about four calls of 1,000 rows (24 bytes a row as a run)


@contextlib.contextmanager
def _threshold(nbytes: int | None) -> Iterator[None]:
    saved = LOCAL_DISK.spill_bytes
    LOCAL_DISK.spill_bytes = nbytes
    try:
        yield
    finally:
        LOCAL_DISK.spill_bytes = saved


def _batch(root: Path, spill_bytes: int | None) -> dict[str, object]:
    """Version 1 of 5,000 keys, then 40 calls of 1,000 rows (every fifth a removal,
    overlapping keys, some new) and a commit: what the store answered before and after."""
    provider = StateStoreProvider(
        LocalStorage(root), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    with _threshold(1 << 62):
        store = provider.get_store(0)
        base = np.arange(5_000, dtype=np.int64)
        store.apply_arrow(int_table(base, base))
        first = store.commit()
    rng = np.random.default_rng(3)
    with _threshold(spill_bytes):
        store = provider.get_store(first.version, first.checkpoint_id)
        written = LOCAL_DISK.stats.bytes_written
        for call in range(40):
            keys = np.unique(rng.integers(0, 8_000, 1_000))
            store.apply_arrow(int_table(keys, None if call % 5 == 4 else keys * 10 + call))
        on_disk = sum(isinstance(run, DiskRun) for run in store._pending.runs)
        probes = [int(k) for k in rng.integers(0, 8_000, 200)]
        before = {
            "gets": [store.get(k) for k in probes],
            "rows": len(store),
            "updates": list(store.updates()),
        }
        info = store.commit()
        spilled = LOCAL_DISK.stats.bytes_written - written
    state = provider.get_read_store(info.version, info.checkpoint_id)
    return {
        **before,
        "delta_rows": info.file_rows,
        "state": sorted(state.items()),
        "committed_rows": info.rows,
        "on_disk": on_disk,
        "spilled": spilled,
    }


def test_many_calls_past_the_threshold_spill_and_equal_the_calls_in_memory(
    tmp_path: Path,
) -> None:
    on_disk = _batch(tmp_path / "disk", THRESHOLD)
    in_memory = _batch(tmp_path / "memory", 1 << 62)
    assert on_disk.pop("on_disk") >= 1 and in_memory.pop("on_disk") == 0
    assert on_disk.pop("spilled") > 0 and in_memory.pop("spilled") == 0
    assert on_disk == in_memory
    assert any(value is None for _, value in in_memory["updates"])  # type: ignore[attr-defined]
    assert in_memory["committed_rows"] == len(in_memory["state"])  # type: ignore[arg-type]


def test_a_small_batch_on_disk_still_writes_format_3(tmp_path: Path) -> None:
    provider = StateStoreProvider(
        LocalStorage(tmp_path), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    with _threshold(0):  # every change run goes to disk
        store = provider.get_store(0)
        for start in range(0, 300, 100):
            keys = np.arange(start, start + 100, dtype=np.int64)
            store.apply_arrow(int_table(keys, keys))
        assert store._pending.runs[0].on_disk
        info = store.commit()
    data = LocalStorage(tmp_path).read(info.path)
    assert int.from_bytes(data[8:10], "little") == checkpoint_format.DELTA_FORMAT_VERSION
    assert dict(provider.get_read_store(1, info.checkpoint_id).items())[(299,)] == (299,)


def test_a_call_that_spills_onto_a_full_local_disk_fails_typed_and_keeps_the_changes(
    tmp_path: Path,
) -> None:
    """A call whose change runs pass the threshold with no local room for them: LocalDiskFull
    naming the store, no run file left, and the store still answers with every change
    made (the spill failed, the runs stayed in memory)."""
    provider = StateStoreProvider(
        LocalStorage(tmp_path / "root"), 0, 0, key_schema="k bigint", value_schema="v bigint"
    )
    store = provider.get_store(0)
    keys = np.arange(200_000, dtype=np.int64)  # 4.8 MB as a run, on a 1 MiB disk
    with local_tmpfs(tmp_path) as mount, _threshold(THRESHOLD):
        store.apply_arrow(int_table(keys[:10], keys[:10]))
        with pytest.raises(LocalDiskFull) as caught:
            store.apply_arrow(int_table(keys, keys + 1))
        assert not list(mount.rglob("*.arrow"))
    assert caught.value.store == provider.store_id
    assert caught.value.needed >= 200_000 * 16
    assert store.get(5) == (6,) and store.get(199_999) == (200_000,)
    store.abort()
