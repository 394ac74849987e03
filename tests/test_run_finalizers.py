"""A run on disk dropped inside a garbage collection: its finalizer may run in any allocation,
also one made while this thread holds the block cache's lock (or the open files' lock), and
deleting its file takes that lock. The finalizer only queues the file; the next sweep (before
a run is written, when the figures are read) deletes it."""

from __future__ import annotations

import gc
import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from state_runtime.store.disk_runs import BLOCKS, LOCAL_DISK, DiskRun
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_writer import written
from state_runtime.store.sorted_runs import Run

KEY = pa.struct([("k", pa.int64())])
VALUE = pa.struct([("v", pa.int64())])


def _run_on_disk(rows: int) -> DiskRun:
    keys = pa.StructArray.from_arrays([pa.array(np.arange(rows))], fields=list(KEY))
    values = pa.StructArray.from_arrays([pa.array(np.arange(rows))], fields=list(VALUE))
    run = Run.build(KeyIndexer(KEY), keys, values)[0]
    on_disk = written("finalizers", [run], KEY, VALUE, run.nbytes, compaction=False)
    assert isinstance(on_disk, DiskRun)
    return on_disk


class _CollectingDict(OrderedDict[Any, Any]):
    """The block cache's table, collecting garbage when a block is put (under its lock)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        gc.collect()
        super().__setitem__(key, value)


def test_a_run_collected_under_the_block_cache_lock_is_deleted_at_the_next_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    garbage = _run_on_disk(2000)
    path, size = garbage.path, garbage.file_bytes
    garbage.cycle = garbage  # type: ignore[attr-defined]  # freed by a collection only
    del garbage
    kept = _run_on_disk(2000)
    monkeypatch.setattr(BLOCKS, "_blocks", _CollectingDict())  # restored with its count:
    monkeypatch.setattr(BLOCKS, "_used", 0)
    gc.disable()  # the collection happens where the test puts it
    try:
        reader = threading.Thread(target=kept.block, args=(0,), daemon=True)
        reader.start()
        reader.join(timeout=30)
    finally:
        gc.enable()
    assert not reader.is_alive(), "the finalizer waited for the lock its own thread holds"
    assert os.path.exists(path)  # queued, not deleted under the lock
    before = LOCAL_DISK.stats.local_disk_bytes
    LOCAL_DISK.sweep()
    assert not os.path.exists(path)
    assert LOCAL_DISK.stats.local_disk_bytes == before - size
