"""state_runtime: a versioned, fault-tolerant key-value state store for PySpark streaming."""

from state_runtime.checkpoint import CheckpointInfo
from state_runtime.config import StoreConfig
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.metrics import LoadMetrics, LoadSource, StoreMetrics
from state_runtime.provider import StateStoreProvider
from state_runtime.schema_evolution import SchemaChange
from state_runtime.schema_history import SchemaHistory
from state_runtime.storage import LocalStorage, Storage, open_storage
from state_runtime.store import ReadStateStore, StateStore

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
