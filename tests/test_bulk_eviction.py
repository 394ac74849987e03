"""Bulk removal by condition on the columnar store (``matching`` / ``remove_matching``)
against a dict model, across layered versions and this instance's own pending changes."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.compute as pc
import pytest

from state_runtime.errors import StoreClosed
from state_runtime.storage import open_storage

from .store_helpers import provider_for


def _at_most(bound: int):  # type: ignore[no-untyped-def]
    return lambda _keys, values: pc.less_equal(pc.struct_field(values, "count"), bound)


def test_matching_and_removal_follow_the_newest_value_of_each_key(tmp_path: Path) -> None:
    rng = random.Random(7)
    provider = provider_for(open_storage(str(tmp_path)))
    model: dict[str, int] = {}
    info = None
    # Many small commits: the version is a base under several change runs, with removals.
    for _ in range(12):
        store = (
            provider.get_store(0)
            if info is None
            else provider.get_store(info.version, info.checkpoint_id)
        )
        for _ in range(60):
            key = f"k{rng.randrange(200)}"
            if rng.random() < 0.2:
                store.remove((key,))
                model.pop(key, None)
            else:
                model[key] = rng.randrange(100)
                store.put((key,), (model[key],))
        bound = rng.randrange(100)
        found = store.matching(_at_most(bound))
        assert {
            k["user"]: v["count"] for k, v in zip(*found.to_pydict().values(), strict=True)
        } == {k: v for k, v in model.items() if v <= bound}
        if rng.random() < 0.5:
            removed = store.remove_matching(_at_most(bound))
            assert removed.num_rows == sum(1 for v in model.values() if v <= bound)
            model = {k: v for k, v in model.items() if v > bound}
        info = store.commit()
        assert dict((k[0], v[0]) for k, v in store.items()) == model
    reread = provider_for(open_storage(str(tmp_path))).get_read_store(info.version)
    assert {k[0]: v[0] for k, v in reread.items()} == model
    assert reread.matching(_at_most(100)).num_rows == len(model)


def test_remove_matching_needs_an_open_store(tmp_path: Path) -> None:
    provider = provider_for(open_storage(str(tmp_path)))
    store = provider.get_store(0)
    store.put(("a",), (1,))
    store.commit()
    with pytest.raises(StoreClosed):
        store.remove_matching(_at_most(5))
