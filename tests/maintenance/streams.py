"""Real stores for maintenance tests, written the way the runtime writes them.

Each batch opens every store at its committed version, updates rows, commits a delta
through :class:`StateStoreProvider` (real files), and commits the batch in the catalog in
one transaction, as the Spark driver does. A model of each store's rows lets tests check
that every retained version still loads to the right state after maintenance.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from state_runtime import CheckpointInfo, StateStoreProvider, StoreConfig
from state_runtime.catalog import Catalog, StoreKey
from state_runtime.identity import StoreId
from state_runtime.storage import Storage

KEY = "user string"
VALUE = "count bigint"
QUERY = "query-1"


@dataclass
class StoreStream:
    """Stores of one checkpoint root, committed batch by batch."""

    catalog: Catalog
    storage: Storage
    stores: list[StoreId]
    query: str = QUERY
    register: bool = True
    keys_per_store: int = 50
    seed: int = 7
    idle: frozenset[int] = frozenset()
    """Batches that change nothing (their versions have no file)."""
    committed: dict[StoreId, list[CheckpointInfo]] = field(default_factory=dict)
    states: dict[StoreId, list[dict[str, int]]] = field(default_factory=dict)
    batch: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.providers = {s: self.provider(s) for s in self.stores}
        for store in self.stores:
            self.states[store] = [{}]
            if self.register:
                self.catalog.register_store(self.root, store, KEY, VALUE)

    @property
    def root(self) -> str:
        """The root as the runtime records it: the storage URI."""
        return self.storage.uri

    def key(self, store: StoreId) -> StoreKey:
        return StoreKey(self.root, store)

    def provider(self, store: StoreId) -> StateStoreProvider:
        """A fresh provider, as another process would have."""
        return StateStoreProvider(
            self.storage,
            store.operator_id,
            store.partition_id,
            store.store_name,
            key_schema=KEY,
            value_schema=VALUE,
            config=StoreConfig(),
        )

    def write(self, store: StoreId) -> tuple[CheckpointInfo, dict[str, int]]:
        """Write (not commit) the next version of ``store``: a few puts and a removal."""
        chain = self.committed.get(store, [])
        provider = self.providers[store]
        handle = (
            provider.get_store(chain[-1].version, chain[-1].checkpoint_id)
            if chain
            else provider.get_store(0)
        )
        state = dict(self.states[store][-1])
        if self.batch in self.idle and chain:
            return handle.commit(), state
        for _ in range(5):
            k = f"user{self.rng.randrange(self.keys_per_store)}"
            state[k] = state.get(k, 0) + 1
            handle.put((k,), (state[k],))
        if state and self.rng.random() < 0.3:
            gone = sorted(state)[0]
            del state[gone]
            handle.remove((gone,))
        return handle.commit(), state

    def commit(self) -> list[CheckpointInfo]:
        """One micro-batch over every store, committed in one catalog transaction."""
        written = {s: self.write(s) for s in self.stores}
        infos = [info for info, _ in written.values()]
        self.catalog.commit_batch(self.root, self.query, self.batch, infos)
        for store, (info, state) in written.items():
            self.committed.setdefault(store, []).append(info)
            self.states[store].append(state)
        self.batch += 1
        return infos

    def run(self, batches: int) -> None:
        for _ in range(batches):
            self.commit()

    def abandoned_attempt(self, store: StoreId) -> CheckpointInfo:
        """A task attempt that wrote and recorded a delta but lost: never committed."""
        return self.abandoned_attempts(store, 1)[0]

    def abandoned_attempts(self, store: StoreId, count: int) -> list[CheckpointInfo]:
        """``count`` such attempts at the store's next version, recorded in one call."""
        infos = []
        for _ in range(count):
            infos.append(self.write(store)[0])
            self.providers[store].drop_cache()
        self.catalog.record_files(self.root, infos)
        return infos

    def loaded(self, store: StoreId, version: int) -> dict[str, int]:
        """The rows of a committed version, loaded by a fresh provider from files."""
        info = self.committed[store][version - 1]
        read = self.provider(store).get_read_store(version, info.checkpoint_id)
        return {k[0]: v[0] for k, v in read.items()}

    def expected(self, store: StoreId, version: int) -> dict[str, int]:
        return self.states[store][version]
