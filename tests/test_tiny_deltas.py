"""A chain's tiny deltas decoded together (state_runtime/store/tiny_deltas.py) load the state
that decoding each alone loads, and a fault in one is reported as a whole read of each
reports it: random chains of puts, removes and re-puts, narrow and wide values, keys in and
out of index order and of two fields, a schema evolved mid-chain, read whole and by ``get``
of present and absent keys; a damaged delta before a missing one, and one whose lineage
also disagrees with its format 2 child's."""

from __future__ import annotations

import dataclasses
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
from state_runtime.store.checkpoint_format import DELTA_FORMAT_VERSION, MAGIC, format_of
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


def _row(key: str, k: int) -> tuple[Any, ...]:
    """Key ``k`` under the key schema ``key``."""
    if key == "k string":
        return (str(k),)
    if key == "k bigint, s string":
        return (k % 7, str(k))
    return (k,)


def _load(
    storage: Storage, history: SchemaHistory, ref: CheckpointRef, probes: list[Any]
) -> tuple[dict[Any, Any], list[Any]]:
    """The state of ``ref`` loaded cold, from its files, and what ``get`` finds of ``probes``."""
    read = _provider(storage, history).get_read_store(ref.version, ref.checkpoint_id)
    return dict(read.items()), [read.get(p) for p in probes]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # in index order, hashed, and a struct of two fields
    key=st.sampled_from(["k bigint", "k string", "k bigint, s string"]),
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
                store.put(_row(key, k), (v,) if history is first else (v, None))
                model[_row(key, k)] = v
            for k in removes:
                store.remove(_row(key, k))
                model.pop(_row(key, k), None)
            info = store.commit()
            ref = CheckpointRef(info.version, info.checkpoint_id)
        probes = [_row(key, k) for k in range(96)]  # keys above 90 never put
        together = _load(storage, newest, ref, probes)
        with mock.patch.object(loader, "is_tiny", lambda header: False):
            alone = _load(storage, newest, ref, probes)
        assert together == alone
        assert together[0] == {k: (v, None) for k, v in model.items()}
        assert together[1] == [(model[p], None) if p in model else None for p in probes]


def _commit(
    provider: StateStoreProvider, ref: CheckpointRef, rows: dict[int, int]
) -> CheckpointRef:
    store = provider.get_store(ref.version, ref.checkpoint_id)
    for k, v in rows.items():
        store.put((k,), (v,))
    info = store.commit()
    return CheckpointRef(info.version, info.checkpoint_id)


def _damage(
    storage: Storage, provider: StateStoreProvider, ref: CheckpointRef, lineage: Any = None
) -> str:
    """Rewrite ``ref``'s delta (two rows) as a sound format 3 file whose rows do not decode
    (a delta encoding's first step not 0), with ``lineage`` in its header if given; its path."""
    path = provider.store_id.file_path(ref.version, ref.checkpoint_id, FileKind.DELTA)
    header = provider.read_header(ref, FileKind.DELTA)
    if lineage is not None:
        header = dataclasses.replace(header, lineage=lineage)
    narrow = pa.struct([("k", pa.int8())])
    stored = pa.table(
        {
            "key": pa.array([{"k": 5}, {"k": 1}], type=narrow),  # a delta's first step is 0
            "value": pa.array([{"v": 4}, {"v": 5}], type=provider.schema.value_arrow),
        }
    )
    damaged = compact_format.encode(
        MAGIC, header, stored, {"key.0": {"kind": "delta", "base": 4}}, "none", None
    )
    storage.delete([path])
    storage.write_if_absent(path, damaged)
    return path


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
    path = _damage(storage, provider, v3)
    storage.delete([provider.store_id.file_path(v2.version, v2.checkpoint_id, FileKind.DELTA)])
    with pytest.raises(CheckpointFileCorrupt, match="delta steps must start at 0") as err:
        _provider(storage, history).get_read_store(v3.version, v3.checkpoint_id)
    assert err.value.path == path


def test_a_damaged_tiny_delta_is_named_before_its_lineage_disagreeing(tmp_path: Any) -> None:
    """A tiny delta below a format 2 delta (whose header holds its whole lineage), its rows
    damaged and its header's parent not the one its child names: a whole read stops at its
    rows before comparing lineages, so its rows' fault is reported, not LineageBroken."""
    storage = LocalStorage(str(tmp_path))
    history = SchemaHistory.of(StateSchema.of("k bigint", "v bigint"))
    provider = _provider(storage, history)
    v1 = _commit(provider, CheckpointRef(0, None), {1: 1})
    v2 = _commit(provider, v1, {3: 3, 4: 4})
    rows = 70_000  # more than a record batch: written in format 2
    store = provider.get_store(v2.version, v2.checkpoint_id)
    store.apply_arrow(
        pa.table(
            {
                "key": pa.StructArray.from_arrays([pa.array(range(rows), pa.int64())], ["k"]),
                "value": pa.StructArray.from_arrays([pa.array(range(rows), pa.int64())], ["v"]),
            }
        )
    )
    info = store.commit()
    v3 = CheckpointRef(info.version, info.checkpoint_id)
    top = provider.store_id.file_path(v3.version, v3.checkpoint_id, FileKind.DELTA)
    assert format_of(storage.read(top)) != DELTA_FORMAT_VERSION
    elsewhere = (CheckpointRef(v1.version, "0" * 32),)  # not v1's id
    path = _damage(storage, provider, v2, lineage=elsewhere)
    with pytest.raises(CheckpointFileCorrupt, match="delta steps must start at 0") as err:
        _provider(storage, history).get_read_store(v3.version, v3.checkpoint_id)
    assert err.value.path == path


def test_a_damaged_tiny_delta_of_a_whole_chain_is_raised_once(tmp_path: Any) -> None:
    """A chain whose files are all there, its newest tiny delta's rows damaged: the fault is
    raised as decoding found it (its cause the decoding's error), not found again by
    decoding the chain a second time and chained onto itself."""
    storage = LocalStorage(str(tmp_path))
    history = SchemaHistory.of(StateSchema.of("k bigint", "v bigint"))
    provider = _provider(storage, history)
    v1 = _commit(provider, CheckpointRef(0, None), {1: 1, 2: 2})
    v2 = _commit(provider, v1, {4: 4, 5: 5})
    path = _damage(storage, provider, v2)
    with pytest.raises(CheckpointFileCorrupt, match="delta steps must start at 0") as err:
        _provider(storage, history).get_read_store(v2.version, v2.checkpoint_id)
    assert err.value.path == path
    assert not isinstance(err.value.__cause__, CheckpointFileCorrupt)
