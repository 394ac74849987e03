"""Executor-side state: the providers a Python worker keeps between tasks.

PySpark reuses Python worker processes, so module-level caches survive from one task to the
next. A partition is not pinned to a worker, though: the copy a worker holds is often a few
versions behind, and the provider rolls it forward by applying only the deltas it missed.
Cached versions of all stores share the process's memory budget (``STATE_CACHE_BYTES``,
:mod:`state_runtime.store.cache`), least recently used first: a copy stays warm until memory is
needed, however many versions behind it falls.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
from typing import Any

import pyarrow as pa

from state_runtime.identity import StoreId
from state_runtime.storage import Storage
from state_runtime.store.config import StoreConfig
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.schema_history import SchemaHistory

_lock = threading.Lock()
_providers: dict[tuple[Any, ...], StateStoreProvider] = {}
_settled = False


def worker_id() -> str:
    """This Python worker process, as the coordinator names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def provider_for(
    storage: Storage, store: StoreId, history: SchemaHistory, config: StoreConfig
) -> StateStoreProvider:
    """This worker's provider of ``store`` under ``history`` (created on first use; a
    schema change makes a new one, which reads the older files through the projection).

    ``storage`` arrives pickled with each task; the first one seen for a root is kept.
    Providers whose cached versions the memory budget evicted are forgotten here too.
    """
    key = (storage.uri, store, tuple(history.ids), config)
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            provider = StateStoreProvider(
                storage,
                store.operator_id,
                store.partition_id,
                store.store_name,
                history=history,
                config=config,
            )
            for idle in [k for k, p in _providers.items() if not p.cached_versions]:
                del _providers[idle]
            _providers[key] = provider
        return provider


def release_unused() -> None:
    """Give the memory a piece's update freed back to the system, before the next piece or
    the commit: with Arrow's system pool (``ARROW_DEFAULT_MEMORY_POOL=system``, which
    docs/running-for-real.md recommends for disk mode and bench_e2e sets), Arrow's
    ``release_unused`` is glibc's ``malloc_trim(0)``, which also returns the pages Python and
    numpy freed inside the heap. Freed heap pages stay resident otherwise, and the commit's
    allocations do not all fit them: a worker's peak 3.4 MiB lower on its first batch
    (``bench_update_task.py``, 5M keys; docs/state-on-disk.md, "Issue 37, a worker's fixed
    overhead"), for 0.3 to 1.1 ms of CPU a call. Not on Arrow's other pools: on mimalloc (the
    default) it is ``mi_collect``, which Arrow documents as detrimental outside debugging (a
    review measured 12 to 15% more CPU a piece), and its freed pages are mimalloc's to keep."""
    pool = pa.default_memory_pool()
    if pool.backend_name == "system":
        pool.release_unused()


def settle() -> None:
    """After this worker's first task: move every object alive now (the imported modules)
    out of the cyclic garbage collector's sight, once.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker, and a
    full collection walks every tracked object: with pyarrow, pandas, SQLAlchemy and pyspark
    imported that took 70-100 ms of each task on the 2-core machine, more than the task's own
    work. ``gc.freeze()`` (CPython's documented mechanism for long-lived processes) leaves
    those objects alone; reference counting still frees them, and objects created later are
    collected as usual. No collection first: it would cost a worker that is not reused as much
    as it saves (the cyclic garbage frozen with it is what one task left, once). See
    docs/runtime.md, "Where a batch's time goes".
    """
    global _settled
    with _lock:
        if _settled:
            return
        _settled = True
    gc.freeze()
