"""Loading a chain of deltas counts each delta's rows from one union of the chain's runs
(issue 35): :func:`~state_runtime.store.versions.counted_union` gives what
:func:`~state_runtime.store.versions.row_change` on each delta in turn gives (puts, removes,
keys changed in many deltas, keys that share an index key) and the union's squash is
:func:`~state_runtime.store.versions.squash`'s run, a cold load of a chain written
through the store (puts, removes, a schema change in its middle) equals a dict model, and
its lookups no longer grow with the square of the chain's length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage
from state_runtime.store.keys import INT64_MIN, KeyIndexer
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.sorted_runs import Run
from state_runtime.store.state_schema import StateSchema
from state_runtime.store.versions import counted_union, row_change, squash

from .store_helpers import FewHashes

VALUE = pa.struct([("v", pa.int64())])


STRING = pa.struct([("k", pa.string()), ("n", pa.int64())])
INDEXERS = {
    "int": (KeyIndexer(pa.struct([("k", pa.int64())])), [None, INT64_MIN, -1, 0, 1, 2, 7]),
    "string": (KeyIndexer(STRING), [(s, n) for s in ("a", "b", None) for n in (0, 1)]),
    "colliding": (FewHashes(STRING, 3), [(s, n) for s in ("a", "b", "c", None) for n in (0, 1)]),
}

Changes = dict[int, int | None]  # position in the key universe -> value (None: a removal)


def _run(indexer: KeyIndexer, universe: list[Any], changes: Changes) -> Run:
    keyed = [(universe[i], v) for i, v in changes.items()]
    if indexer.type.num_fields == 1:
        keys = pa.array([{"k": k} for k, _ in keyed], type=indexer.type)
    else:
        keys = pa.array([{"k": k[0], "n": k[1]} for k, _ in keyed], type=indexer.type)
    values = pa.array([None if v is None else {"v": v} for _, v in keyed], type=VALUE)
    run, duplicates = Run.build(indexer, keys, values)
    assert not duplicates
    return run


@st.composite
def _chains(draw: st.DrawFn) -> tuple[str, Changes, list[Changes]]:
    kind = draw(st.sampled_from(sorted(INDEXERS)))
    size = len(INDEXERS[kind][1])
    positions = st.integers(0, size - 1)
    base = draw(st.dictionaries(positions, st.integers(0, 9), max_size=size))
    change = st.dictionaries(positions, st.none() | st.integers(0, 9), max_size=size)
    return kind, base, draw(st.lists(change, max_size=12))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_chains())
def test_one_union_counts_what_each_delta_in_turn_counts(
    chain: tuple[str, Changes, list[Changes]],
) -> None:
    kind, base, deltas = chain
    indexer, universe = INDEXERS[kind]
    base_run = _run(indexer, universe, base)
    runs = [_run(indexer, universe, d) for d in deltas]
    stack: list[Run] = [base_run]
    expected, model = [], set(base)
    for run, delta in zip(runs, deltas, strict=True):
        expected.append(row_change(indexer, stack, run))
        stack.insert(0, run)
        before = len(model)
        model |= {i for i, v in delta.items() if v is not None}
        model -= {i for i, v in delta.items() if v is None}
        assert expected[-1] == len(model) - before
    assert counted_union(indexer, [base_run], runs, squash=False)[0].tolist() == expected
    counts, squashed = counted_union(indexer, [base_run], runs, squash=True)
    assert counts.tolist() == expected
    if squashed is not None and len(runs) > 2:  # the loader's squash from the union
        alike = squash(indexer, runs[::-1])
        assert isinstance(alike, Run)
        assert squashed.index.tolist() == alike.index.tolist()
        assert squashed.keys.to_pylist() == alike.keys.to_pylist()
        assert squashed.values.to_pylist() == alike.values.to_pylist()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.dictionaries(st.sampled_from("abcdefgh"), st.none() | st.integers(0, 9), max_size=5),
        min_size=1,
        max_size=14,
    ),
    st.integers(0, 14),
)
def test_a_cold_load_of_a_chain_equals_the_model(
    tmp_path_factory: pytest.TempPathFactory, batches: list[dict[str, int | None]], evolve_at: int
) -> None:
    """Batches of puts and removes, the value schema gaining a nullable field before batch
    ``evolve_at``; each version loaded cold (a fresh provider) through its whole chain."""
    storage = LocalStorage(tmp_path_factory.mktemp("chain"))
    history = SchemaHistory.of(StateSchema.of("k string", "v bigint"))
    ref: tuple[int, str | None] = (0, None)
    model: dict[str, tuple[Any, ...]] = {}
    versions = []
    for i, batch in enumerate(batches):
        if i == evolve_at:
            history, _ = history.evolve(StateSchema.of("k string", "v bigint, w bigint"), None, 1)
            model = {k: (*v, None) for k, v in model.items()}
        wide = i >= evolve_at
        store = StateStoreProvider(storage, 0, 0, history=history).get_store(*ref)
        for key, value in batch.items():
            if value is None:
                store.remove((key,))
                model.pop(key, None)
            else:
                row = (value, value) if wide else (value,)
                store.put((key,), row)
                model[key] = row
        info = store.commit()
        ref = (info.version, info.checkpoint_id)
        versions.append((ref, dict(model)))
    wide = len(history.newest.schema.value_arrow) == 2  # read under the newest schema
    for ref, state in versions:
        loaded = StateStoreProvider(storage, 0, 0, history=history).get_read_store(*ref)
        widened = {k: (*v, None) if wide and len(v) == 1 else v for k, v in state.items()}
        assert {k[0]: v for k, v in loaded.items()} == widened
        assert loaded.metrics.rows == len(state)


def test_lookups_of_a_cold_load_do_not_grow_with_the_square_of_the_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain of 60 tiny deltas: the row counts take a constant number of lookups (one
    per run below the chain), where looking each delta up in every older one took n²/2."""
    storage = LocalStorage(tmp_path)
    provider = StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")
    ref: tuple[int, str | None] = (0, None)
    for version in range(60):
        store = provider.get_store(*ref)
        store.put((version % 7,), (version,))
        if version % 5 == 4:
            store.remove(((version + 3) % 7,))
        info = store.commit()
        ref = (info.version, info.checkpoint_id)
    calls = 0
    positions = Run.positions

    def counted(self: Run, *args: Any, **kwargs: Any) -> np.ndarray:
        nonlocal calls
        calls += 1
        return positions(self, *args, **kwargs)

    monkeypatch.setattr(Run, "positions", counted)
    loaded = StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")
    state = loaded.get_read_store(*ref)
    assert state.metrics.load.deltas_applied == 60
    assert calls <= 5, f"{calls} lookups for a chain of 60 deltas"
