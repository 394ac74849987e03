"""A chain's tiny deltas decoded together (state_runtime/store/tiny_deltas.py) load the state
that decoding each alone loads, and a fault in one is reported as a whole read of each
reports it: random chains of puts, removes and re-puts, narrow and wide values, keys in and
out of index order, a schema evolved mid-chain; and a damaged delta before a missing one."""

from __future__ import annotations

import tempfile
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime import StateStoreProvider, StoreConfig
from state_runtime.errors import CheckpointFileCorrupt
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.storage import LocalStorage, Storage
from state_runtime.store import compact_format, loader
from state_runtime.store.checkpoint_format import MAGIC
from state_runtime.store.column_encoding import SMALL
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

CONFIG = StoreConfig(min_deltas_for_snapshot=1000)  # every load walks the deltas
VALUES = st.one_of(
    st.integers(-100, 100), st.integers(-(2**40), 2**40), st.integers(-(2**63), 2**63 - 1)
)
BATCH = st.tuples(
    st.dictionaries(st.integers(0, 90), VALUES, max_size=SMALL + 8),  # a few not tiny
    st.sets(st.integers(0, 90), max_size=6),
)


def _provider(storage: Storage, history: SchemaHistory) -> StateStoreProvider:
    return StateStoreProvider(storage, 0, 0, history=history, config=CONFIG)


def _load(storage: Storage, history: SchemaHistory, ref: CheckpointRef) -> dict[Any, Any]:
    """The state of ``ref`` loaded cold, from its files."""
    return dict(_provider(storage, history).get_read_store(ref.version, ref.checkpoint_id).items())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.sampled_from(["k bigint", "k string"]),  # in index order, and hashed
    batches=st.lists(BATCH, min_size=1, max_size=14),
    evolve_at=st.integers(0, 14),
)
def test_chains_load_the_same_state_decoded_together_or_alone(
    key: str, batches: list[tuple[dict[int, int], set[int]]], evolve_at: int
) -> None:
    with tempfile.TemporaryDirectory(prefix="tiny-") as root:
        storage = LocalStorage(root)
        first = SchemaHistory.of(StateSchema.of(key, "v bigint"))
        newest, _ = first.evolve(StateSchema.of(key, "v bigint, w bigint"), SchemaChange(), 1)
        ref = CheckpointRef(0, None)
        model: dict[Any, int] = {}
        for n, (puts, removes) in enumerate(batches):
            history = newest if n >= evolve_at else first
            store = _provider(storage, history).get_store(ref.version, ref.checkpoint_id)
            for k, v in puts.items():
                row = (str(k),) if key == "k string" else (k,)
                store.put(row, (v,) if history is first else (v, None))
                model[row] = v
            for k in removes:
                row = (str(k),) if key == "k string" else (k,)
                store.remove(row)
                model.pop(row, None)
            info = store.commit()
            ref = CheckpointRef(info.version, info.checkpoint_id)
        together = _load(storage, newest, ref)
        with mock.patch.object(loader, "is_tiny", lambda header: False):
            alone = _load(storage, newest, ref)
        assert together == alone
        assert together == {k: (v, None) for k, v in model.items()}


def _commit(
    provider: StateStoreProvider, ref: CheckpointRef, rows: dict[int, int]
) -> CheckpointRef:
    store = provider.get_store(ref.version, ref.checkpoint_id)
    for k, v in rows.items():
        store.put((k,), (v,))
    info = store.commit()
    return CheckpointRef(info.version, info.checkpoint_id)


def test_a_damaged_tiny_delta_is_named_before_a_missing_one_below_it(tmp_path: Any) -> None:
    """A whole read of each file stops at the first damaged one in the walk: its rows are
    decoded later here, and still reported first (not the missing delta the walk meets
    after it)."""
    storage = LocalStorage(str(tmp_path))
    history = SchemaHistory.of(StateSchema.of("k bigint", "v bigint"))
    provider = _provider(storage, history)
    v1 = _commit(provider, CheckpointRef(0, None), {1: 1, 2: 2})
    v2 = _commit(provider, v1, {3: 3})
    v3 = _commit(provider, v2, {4: 4, 5: 5})
    path = provider.store_id.file_path(v3.version, v3.checkpoint_id, FileKind.DELTA)
    header = provider.read_header(v3, FileKind.DELTA)
    narrow = pa.struct([("k", pa.int8())])
    stored = pa.table(
        {
            "key": pa.array([{"k": 5}, {"k": 1}], type=narrow),  # a delta's first step is 0
            "value": pa.array([{"v": 4}, {"v": 5}], type=history.newest.schema.value_arrow),
        }
    )
    damaged = compact_format.encode(
        MAGIC, header, stored, {"key.0": {"kind": "delta", "base": 4}}, "none", None
    )
    storage.delete([path])
    storage.write_if_absent(path, damaged)
    storage.delete([provider.store_id.file_path(v2.version, v2.checkpoint_id, FileKind.DELTA)])
    with pytest.raises(CheckpointFileCorrupt, match="delta steps must start at 0") as err:
        _provider(storage, history).get_read_store(v3.version, v3.checkpoint_id)
    assert err.value.path == path
