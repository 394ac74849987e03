"""Property test: random puts, removes, commits, aborts, reopens, snapshots, cleanups and cache
drops against a plain dict model. Every retained committed version must load equal to it.

``STATE_PROPERTY_EXAMPLES=10000`` runs that many generated sequences instead of 60 (a long
run, reported in docs/state-in-memory.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import timedelta

import pyarrow as pa
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from state_runtime import CheckpointRef, StateStore, StateStoreProvider, StoreConfig
from state_runtime.storage import LocalStorage
from state_runtime.store.file_cleanup import cleanup

from .store_helpers import forced_disk

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
RETAIN = 2


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="prop-")
        self.storage = LocalStorage(self.root)
        self.config = StoreConfig(
            min_versions_to_retain=RETAIN, min_deltas_for_snapshot=3, cached_versions=2
        )
        self.provider = self._fresh()
        # The committed lineage, as the commit log has it: index = version.
        self.chain: list[tuple[CheckpointRef, dict[str, int]]] = [(CheckpointRef(0, None), {})]
        self.store: StateStore | None = None
        self.pending: dict[str, int] = {}

    def _fresh(self) -> StateStoreProvider:
        return StateStoreProvider(
            self.storage, 0, 0, key_schema="k string", value_schema="v bigint", config=self.config
        )

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _retained(self) -> list[tuple[CheckpointRef, dict[str, int]]]:
        return self.chain[-RETAIN:]

    @rule(back=st.integers(0, RETAIN - 1))
    def reopen(self, back: int) -> None:
        if self.store is not None:
            self.store.abort()
        ref, state = self._retained()[-1 - min(back, len(self._retained()) - 1)]
        self.store = self.provider.get_store(ref.version, ref.checkpoint_id)
        self.pending = dict(state)

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS, value=st.integers(-5, 5))
    def put(self, key: str, value: int) -> None:
        assert self.store is not None
        self.store.put(key, value)
        self.pending[key] = value

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        assert self.store is not None
        self.store.remove(key)
        self.pending.pop(key, None)

    @precondition(lambda self: self.store is not None)
    @rule(puts=st.dictionaries(KEYS, st.integers(-5, 5), max_size=6), removes=st.sets(KEYS))
    def apply_bulk(self, puts: dict[str, int], removes: set[str]) -> None:
        """The bulk path: one Arrow table of puts and removals (a removal wins a tie here)."""
        assert self.store is not None
        keys = [*puts, *removes]
        values: list[dict[str, int] | None] = [{"v": v} for v in puts.values()]
        values += [None] * len(removes)
        self.store.apply_arrow(
            pa.table(
                {
                    "key": pa.array([{"k": k} for k in keys], type=self.provider.schema.key_arrow),
                    "value": pa.array(values, type=self.provider.schema.value_arrow),
                }
            )
        )
        self.pending.update(puts)
        for key in removes:
            self.pending.pop(key, None)

    @precondition(lambda self: self.store is not None)
    @rule(keys=st.lists(KEYS, max_size=6))
    def lookup(self, keys: list[str]) -> None:
        """A batch lookup (before any change, the commit counts its rows with its answers)."""
        assert self.store is not None
        key_type = self.provider.schema.key_arrow
        found = self.store.lookup(pa.array([{"k": k} for k in keys], type=key_type))
        values = [None if row is None else row["v"] for row in found.to_pylist()]
        assert values == [self.pending.get(k) for k in keys]

    @precondition(lambda self: self.store is not None)
    @rule(record=st.booleans())
    def commit(self, record: bool) -> None:
        """Commit; ``record`` says whether the driver puts it in the commit log."""
        assert self.store is not None
        info = self.store.commit()
        if record:
            del self.chain[info.version :]  # a replayed batch replaces what followed
            self.chain.append((info.ref, dict(self.pending)))
        self.store = None

    @precondition(lambda self: self.store is not None)
    @rule()
    def abort(self) -> None:
        assert self.store is not None
        self.store.abort()
        self.store = None

    @rule(back=st.integers(0, RETAIN - 1))
    def snapshot(self, back: int) -> None:
        retained = [r for r, _ in self._retained() if r.version > 0]
        if retained:
            ref = retained[-1 - min(back, len(retained) - 1)]
            self.provider.snapshot(ref.version, ref.checkpoint_id)

    @rule()
    def clean(self) -> None:
        latest = self.chain[-1][0]
        if latest.version > 0:
            cleanup(self.provider, latest, min_age=timedelta(0), dry_run=False)

    @rule()
    def drop_cache(self) -> None:
        self.provider.drop_cache()
        self.provider = self._fresh()

    @invariant()
    def open_store_reads_its_own_writes(self) -> None:
        if self.store is not None:
            assert {k[0]: v[0] for k, v in self.store.items()} == self.pending

    @invariant()
    def retained_versions_load_equal_to_the_model(self) -> None:
        fresh = self._fresh()
        for ref, state in self._retained():
            store = fresh.get_read_store(ref.version, ref.checkpoint_id)
            assert {k[0]: v[0] for k, v in store.items()} == state, ref
            assert len(store) == len(state)


EXAMPLES = int(os.environ.get("STATE_PROPERTY_EXAMPLES", "60"))
StoreModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None
)
test_store_model = StoreModel.TestCase


class StoreModelOnDisk(StoreModel):
    """The same model with a tiny budget: every run on local disk, in blocks of a few rows."""

    def __init__(self) -> None:
        self._disk = forced_disk()
        self._disk.__enter__()
        super().__init__()

    def teardown(self) -> None:
        super().teardown()
        self._disk.__exit__(None, None, None)


StoreModelOnDisk.TestCase.settings = StoreModel.TestCase.settings
test_store_model_on_disk = StoreModelOnDisk.TestCase
