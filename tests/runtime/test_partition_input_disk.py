"""A key-local task's input spilled onto a full local disk (a real 1 MiB tmpfs): the task
fails with LocalDiskFull naming the store, the bytes needed, the free space and the path,
whether the up-front check sees it or the write runs out of room, and leaves no file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from state_runtime.errors import LocalDiskFull
from state_runtime.identity import StoreId
from state_runtime.runtime import partition_input
from state_runtime.runtime.partition_input import PartitionInput
from state_runtime.store.disk_runs import LOCAL_DISK

STORE = StoreId(3, 5, "default")
KEY = pa.struct([("k", pa.int64())])
ROWS = 200_000  # 3.2 MB of two int64 columns and the index: past the 1 MiB disk


def _spill(monkeypatch: pytest.MonkeyPatch) -> LocalDiskFull:
    monkeypatch.setattr(partition_input, "SPILL_ROWS", ROWS)
    rows = PartitionInput(["k"], KEY, STORE)
    batch = pa.record_batch({"k": pa.array(np.arange(ROWS)), "v": pa.array(np.arange(ROWS))})
    with pytest.raises(LocalDiskFull) as caught:
        rows.add(batch)
    return caught.value


def test_spilled_input_larger_than_the_disk_fails_typed_naming_the_store(
    small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = _spill(monkeypatch)
    assert error.code == "STATE_LOCAL_DISK_FULL"
    assert error.store == STORE and "the task's spilled input" in error.reason
    assert error.needed >= ROWS * 24 and error.free <= 1 << 20
    assert f"{error.needed} bytes needed, {error.free} bytes free" in str(error)
    assert not list(small_tmpfs.rglob("*.arrow"))


def test_a_disk_filling_up_while_spilling_input_fails_typed_and_leaves_no_file(
    small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LOCAL_DISK, "check_free", lambda *_: None)  # the write hits ENOSPC
    error = _spill(monkeypatch)
    assert error.store == STORE and "filled up while writing the task's spilled input" in (
        error.reason
    )
    assert error.needed >= ROWS * 24 and error.free <= 1 << 20
    assert error.path is not None and "input-" in str(error.path)
    assert not list(small_tmpfs.rglob("*.arrow"))
