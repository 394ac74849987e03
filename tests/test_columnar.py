"""The columnar state: key types, the index, runs and versions, against a dict model."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_runtime import StateStoreProvider
from state_runtime.storage import Storage
from state_runtime.store.keys import INT64_MIN, KeyIndexer
from state_runtime.store.state_schema import StateSchema
from state_runtime.store.versions import COMPACT_FRACTION

pytestmark = pytest.mark.usefixtures("state_mode")  # in memory, then on disk

KEY_SCHEMAS: dict[str, tuple[str, list[tuple[Any, ...]]]] = {
    "bigint with null and INT64_MIN": ("k bigint", [(1,), (None,), (INT64_MIN,), (-5,)]),
    "int": ("k int", [(1,), (None,), (-(2**31),), (7,)]),
    "string with null": ("k string", [("a",), (None,), ("",), ("é漢",)]),
    "composite": ("u string, d int", [("a", 1), ("a", None), (None, 1), ("b", 1)]),
    "double": ("x double", [(0.0,), (1.5,), (float("inf"),), (None,)]),
    "date and binary": ("d date, b binary", [(dt.date(2026, 1, 1), b"\x00"), (None, b"")]),
    "boolean, smallint, float and timestamp": (
        "b boolean, s smallint, f float, t timestamp",
        [
            (True, 1, 1.5, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
            (None, None, None, None),
            (False, -1, -0.5, dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
        ],
    ),
    "decimal": ("m decimal(10,2)", [(Decimal("1.10"),), (Decimal("-3.00"),), (None,)]),
    "nested": (
        "s struct<a: int, b: string>, l array<int>",
        [((1, "x"), [1, 2]), ((1, "x"), [2, 1]), ((None, None), []), (None, None)],
    ),
}


@pytest.mark.parametrize("case", sorted(KEY_SCHEMAS))
def test_keys_of_every_kind_round_trip(storage: Storage, case: str) -> None:
    key_schema, keys = KEY_SCHEMAS[case]
    p = StateStoreProvider(storage, 3, 0, key_schema=key_schema, value_schema="n bigint")
    store = p.get_store(0)
    for i, key in enumerate(keys):
        store.put(key, (i,))
    assert [store.get(k) for k in keys] == [(i,) for i in range(len(keys))]
    v1 = store.commit()
    fresh = StateStoreProvider(storage, 3, 0, key_schema=key_schema, value_schema="n bigint")
    read = fresh.get_read_store(1, v1.checkpoint_id)
    assert len(read) == len(keys)
    assert [read.get(k) for k in keys] == [(i,) for i in range(len(keys))]
    assert read.get_many(keys) == [(i,) for i in range(len(keys))]
    assert sorted(v for _, v in read.items()) == [(i,) for i in range(len(keys))]
    # Remove the first key, overwrite the last, through the bulk path.
    store = fresh.get_store(1, v1.checkpoint_id)
    table = pa.table(
        {
            "key": fresh.indexer.to_arrow([keys[0], keys[-1]]),
            "value": pa.array([None, {"n": 99}], type=fresh.schema.value_arrow),
        }
    )
    store.apply_arrow(table)
    v2 = store.commit()
    again = StateStoreProvider(storage, 3, 0, key_schema=key_schema, value_schema="n bigint")
    read = again.get_read_store(2, v2.checkpoint_id)
    assert read.get(keys[0]) is None and read.get(keys[-1]) == (99,) and len(read) == len(keys) - 1


def test_float_keys_compare_by_value_with_one_nan_and_one_zero(storage: Storage) -> None:
    p = StateStoreProvider(storage, 0, 0, key_schema="x double", value_schema="n bigint")
    store = p.get_store(0)
    store.apply_arrow(
        pa.table(
            {
                "key": pa.array([{"x": -0.0}, {"x": float("nan")}], type=p.schema.key_arrow),
                "value": pa.array([{"n": 1}, {"n": 2}], type=p.schema.value_arrow),
            }
        )
    )
    assert store.get(0.0) == (1,) and store.get(float("nan")) == (2,)
    store.put(float("nan"), 3)
    store.put(0.0, 4)
    info = store.commit()
    assert info.rows == 2
    assert p.get_read_store(1, info.checkpoint_id).get(-0.0) == (4,)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.text(max_size=12)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.none(), st.floats(allow_nan=True)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_index_of_one_key_equals_the_vectorised_index(keys: list[tuple[Any, ...]]) -> None:
    schema = StateSchema.of("s string, i bigint, f double", "n bigint")
    indexer = KeyIndexer(schema.key_arrow)
    vectorised = indexer.index(indexer.to_arrow(keys)).tolist()
    assert [indexer.index_of(k) for k in keys] == vectorised
    exact = KeyIndexer(StateSchema.of("i bigint", "n bigint").key_arrow)
    ints = [(k[1],) for k in keys]
    assert [exact.index_of(k) for k in ints] == exact.index(exact.to_arrow(ints)).tolist()


def test_many_versions_against_a_dict_model_share_runs(storage: Storage) -> None:
    """Layered changes, merges and compactions give the model's state at every version, and a
    new version shares the runs of the one it was built on."""
    p = StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")
    rng = random.Random(5)
    model: dict[int, int] = {}
    infos = []
    info = None
    for v in range(1, 41):
        store = p.get_store(v - 1, None if info is None else info.checkpoint_id)
        before = store._version
        puts = {rng.randrange(5_000): v for _ in range(rng.choice([10, 200, 2_000]))}
        removes = [k for k in rng.sample(sorted(model), min(len(model), 50)) if k not in puts]
        store.apply(puts=[((k,), (x,)) for k, x in puts.items()], removes=[(k,) for k in removes])
        info = store.commit()
        after = store._version
        if len(after.base) == len(before.base) and after.base is not before.base:
            raise AssertionError("an unchanged base was copied")
        if after.base is not before.base:  # a compaction: the changes had grown large enough
            changed = sum(len(o) for o in before.overlays) + info.file_rows
            assert COMPACT_FRACTION * changed >= len(before.base)
        for k in removes:
            model.pop(k, None)
        model.update(puts)
        infos.append((info, dict(model)))
        assert len(store) == len(model) == info.rows
    fresh = StateStoreProvider(storage, 0, 0, key_schema="k bigint", value_schema="v bigint")
    for info, state in infos[-3:]:
        read = fresh.get_read_store(info.version, info.checkpoint_id)
        assert {k[0]: x[0] for k, x in read.items()} == state
    cached = p.get_read_store(infos[5][0].version, infos[5][0].checkpoint_id)
    assert {k[0]: x[0] for k, x in cached.items()} == infos[5][1]
