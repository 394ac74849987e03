"""The process-wide memory budget for cached versions: LRU across stores, shared runs once."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from state_runtime import LoadSource, StoreConfig
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId
from state_runtime.runtime import worker
from state_runtime.storage import Storage
from state_runtime.store.cache import CACHE, parse_size, set_budget
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

from .store_helpers import commit_rows, provider_for


@pytest.fixture
def budget() -> Iterator[None]:
    """Restores the budget; starts with no other test's providers still cached. Runs stay in
    memory whatever the budget: these tests are about which versions the cache keeps (runs
    larger than a quarter of the budget go to disk otherwise: tests/test_disk_runs.py)."""
    before = CACHE.budget
    gc.collect()
    LOCAL_DISK.spill_bytes = 1 << 62
    yield
    LOCAL_DISK.spill_bytes = None
    set_budget(before)


def test_sizes_parse_with_units_and_bad_ones_name_the_setting() -> None:
    assert parse_size("1024") == 1024 and parse_size("512MiB") == 512 << 20
    assert parse_size(" 2 GiB ") == 2 << 30
    with pytest.raises(InvalidArgument, match="STATE_CACHE_BYTES='lots'"):
        parse_size("lots")
    with pytest.raises(InvalidArgument):
        set_budget(-1)


def test_versions_sharing_runs_count_once(storage: Storage, budget: None) -> None:
    start = CACHE.used
    p = provider_for(storage)
    v1 = commit_rows(p, None, {f"k{i}": i for i in range(20_000)})
    used_one = CACHE.used - start
    v2 = commit_rows(p, v1, {"k1": -1})
    assert {r.version for r in p.cached_versions} == {0, 1, 2}
    # Version 2 is version 1's base plus one small change run: far from twice the bytes.
    assert CACHE.used - start - used_one < used_one / 100
    p.drop_cache()
    assert p.cached_versions == [] and CACHE.used == start
    assert p.get_read_store(2, v2.checkpoint_id).metrics.load.source is LoadSource.FILES


def test_least_recently_used_versions_go_first_across_stores(
    storage: Storage, budget: None
) -> None:
    start = CACHE.used
    a, b = provider_for(storage, 0), provider_for(storage, 1)
    va = commit_rows(a, None, {f"k{i}": i for i in range(20_000)})
    vb = commit_rows(b, None, {f"k{i}": i for i in range(20_000)})
    one_store = (CACHE.used - start) // 2
    a.get_read_store(1, va.checkpoint_id)  # a is now the most recently used
    set_budget(start + int(one_store * 1.5))  # room for one of the two
    assert a.cached_versions and not b.cached_versions
    store = b.get_read_store(1, vb.checkpoint_id)  # b comes back from files, a goes
    assert store.metrics.load.source is LoadSource.FILES
    assert b.cached_versions and not a.cached_versions
    set_budget(0)  # even with no budget the version just used stays
    assert len(b.cached_versions) == 1 and not a.cached_versions


def test_cached_versions_caps_each_provider(storage: Storage) -> None:
    p = provider_for(storage, cached_versions=2)
    info = None
    for i in range(5):
        info = commit_rows(p, info, {f"k{i}": i})
    assert [r.version for r in p.cached_versions] == [4, 5]  # most recently used last


def test_worker_keeps_providers_while_the_budget_holds_their_versions(
    storage: Storage, budget: None
) -> None:
    schema = StateSchema.of("user string", "count bigint")
    store = StoreId(9, 0)
    p = worker.provider_for(storage, store, SchemaHistory.of(schema), StoreConfig())
    assert worker.provider_for(storage, store, SchemaHistory.of(schema), StoreConfig()) is p
    info = commit_rows(p, None, {"a": 1})
    p.get_read_store(1, info.checkpoint_id)
    set_budget(0)
    other = worker.provider_for(storage, StoreId(9, 1), SchemaHistory.of(schema), StoreConfig())
    commit_rows(other, None, {"b": 1})  # evicts the first store's version
    assert not p.cached_versions
    worker.provider_for(
        storage, StoreId(9, 2), SchemaHistory.of(schema), StoreConfig()
    )  # registry is pruned
    assert worker.provider_for(storage, store, SchemaHistory.of(schema), StoreConfig()) is not p


def test_a_provider_that_goes_away_takes_its_versions_along(storage: Storage, budget: None) -> None:
    start = CACHE.used
    p = provider_for(storage)
    commit_rows(p, None, {f"k{i}": i for i in range(1_000)})
    assert CACHE.used > start
    del p  # no cycle keeps it: freed at once, its cached versions with it
    assert CACHE.used == start


@pytest.mark.timeout(60)
def test_a_provider_collected_while_the_cache_is_busy_does_not_deadlock(
    storage: Storage, budget: None
) -> None:
    """The garbage collector may free a provider in the middle of a cache call on the same
    thread (it ran the hypothesis test into a deadlock once): its versions go afterwards."""
    start = CACHE.used
    p = provider_for(storage)
    commit_rows(p, None, {"a": 1})
    with CACHE._lock:  # as if inside a cache call when the collector ran
        del p
    assert CACHE.used == start
