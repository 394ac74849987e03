"""Helpers shared by the store tests."""

from __future__ import annotations

from typing import Any

from state_runtime import CheckpointInfo, StateStoreProvider, StoreConfig
from state_runtime.storage import Storage

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
