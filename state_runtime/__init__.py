"""state_runtime: a versioned, fault-tolerant key-value state store for PySpark streaming."""

from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.storage import LocalStorage, Storage, open_storage
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.config import StoreConfig
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_store import ReadStateStore, StateStore
from state_runtime.store.store_metrics import LoadMetrics, LoadSource, StoreMetrics

__all__ = [
    "CheckpointInfo",
    "CheckpointRef",
    "FileKind",
    "LoadMetrics",
    "LoadSource",
    "LocalStorage",
    "ReadStateStore",
    "SchemaChange",
    "SchemaHistory",
    "StateStore",
    "StateStoreProvider",
    "Storage",
    "StoreConfig",
    "StoreId",
    "StoreMetrics",
    "open_storage",
]
