"""Helpers shared by the store tests."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from state_runtime import CheckpointInfo, StateStoreProvider, StoreConfig
from state_runtime.storage import Storage
from state_runtime.store.checkpoint_format import _ENVELOPE, FORMAT_VERSION, MAGIC
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer

KEY = "user string"
VALUE = "count bigint"


def provider_for(
    storage: Storage, partition: int = 0, *, store_name: str = "default", **config: Any
) -> StateStoreProvider:
    """A fresh provider (empty cache) on ``storage``, as another process would have."""
    return StateStoreProvider(
        storage,
        0,
        partition,
        store_name,
        key_schema=KEY,
        value_schema=VALUE,
        config=StoreConfig(**config),
    )


def commit_rows(
    provider: StateStoreProvider,
    base: CheckpointInfo | None,
    puts: dict[str, int],
    removes: tuple[str, ...] = (),
) -> CheckpointInfo:
    """Open the store after ``base`` (None: version 0), apply updates, commit."""
    store = (
        provider.get_store(0)
        if base is None
        else provider.get_store(base.version, base.checkpoint_id)
    )
    for k, v in puts.items():
        store.put((k,), (v,))
    for k in removes:
        store.remove((k,))
    return store.commit()


def state_of(provider: StateStoreProvider, info: CheckpointInfo | None) -> dict[str, int]:
    store = (
        provider.get_read_store(0)
        if info is None
        else provider.get_read_store(info.version, info.checkpoint_id)
    )
    return {k[0]: v[0] for k, v in store.items()}


def envelope(payload: bytes, fmt: int = FORMAT_VERSION) -> bytes:
    """``payload`` in a checkpoint file's envelope with a right checksum (for crafted files)."""
    digest = hashlib.sha256(payload).digest()
    return _ENVELOPE.pack(MAGIC, fmt, 0, len(payload), digest) + payload


def arrow_stream(
    table: pa.Table, metadata: dict[bytes, bytes] | None, compression: str | None = None
) -> bytes:
    """``table`` as an Arrow IPC stream with ``metadata`` on its schema (None: none)."""
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@contextlib.contextmanager
def forced_disk(block_bytes: int = 64) -> Iterator[None]:
    """Every run of a store goes to local disk, in blocks of a few rows (a tiny budget), and
    a batch lookup maps at most the threshold at once."""
    saved = LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes, LOCAL_DISK.map_bytes
    LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes, LOCAL_DISK.map_bytes = 0, block_bytes, 0
    try:
        yield
    finally:
        LOCAL_DISK.spill_bytes, LOCAL_DISK.block_bytes, LOCAL_DISK.map_bytes = saved


@contextlib.contextmanager
def local_tmpfs(folder: Path) -> Iterator[Path]:
    """Local files written from now on (runs, snapshot spools) go to a real 1 MiB tmpfs
    mounted in a new folder of ``folder``, which it yields (skipped where this machine cannot
    mount one)."""
    mount = folder / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        LOCAL_DISK.set_directory(str(mount))
        yield mount
    finally:
        LOCAL_DISK.set_directory(None)
        subprocess.run(["umount", "-l", str(mount)], check=False)


INT_KEY = pa.struct([("k", pa.int64())])
INT_VALUE = pa.struct([("v", pa.int64())])


class FewHashes(KeyIndexer):
    """Keys hashed to ``buckets`` index keys only: most keys collide (different keys, equal
    index keys), so every search goes on to compare the keys."""

    def __init__(self, key_type: pa.StructType, buckets: int) -> None:
        super().__init__(key_type)
        self.buckets = buckets

    def index(self, keys: pa.StructArray) -> np.ndarray:
        return super().index(keys) % self.buckets


def int_table(keys: np.ndarray, values: np.ndarray | None) -> pa.Table:
    """Rows of the int64 key ``k`` and value ``v`` (``values`` None: removals, null values),
    as ``apply_arrow`` takes them."""
    value = (
        pa.nulls(len(keys), INT_VALUE)
        if values is None
        else pa.StructArray.from_arrays([pa.array(values)], fields=list(INT_VALUE))
    )
    return pa.table(
        {"key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(INT_KEY)), "value": value}
    )
