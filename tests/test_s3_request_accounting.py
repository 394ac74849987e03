"""Request accounting on S3: a commit, a snapshot and a load each cost a known, minimal number
of requests (counted on the wire, retries included, by :class:`S3Storage`)."""

from __future__ import annotations

import pytest

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.storage.s3 import S3Storage
from tests.s3_fixtures import MotoS3
from tests.store_helpers import commit_rows, provider_for, state_of

pytestmark = pytest.mark.s3


@pytest.fixture
def storage(moto_s3: MotoS3) -> S3Storage:
    return moto_s3.storage()


def committed(provider: StateStoreProvider, batches: int) -> list[CheckpointInfo]:
    infos = [commit_rows(provider, None, {f"k{i}": i for i in range(100)})]
    for b in range(1, batches):
        infos.append(commit_rows(provider, infos[-1], {f"k{b}": -b, f"new{b}": b}))
    return infos


def test_a_commit_is_one_put(storage: S3Storage) -> None:
    """One PUT per commit; the first delta under a schema also publishes the schema (a HEAD
    and a PUT, once per root and process: schemas/<id>.json, see
    state_runtime/store/schema_files.py)."""
    provider = provider_for(storage)
    info = commit_rows(provider, None, {"a": 1, "b": 2})
    assert storage.requests.counts == {"head": 1, "put": 2}
    assert storage.exists(f"schemas/{provider.history.newest.schema_id}.json")
    for i in range(3):
        storage.requests.reset()
        info = commit_rows(provider, info, {f"k{i}": i})
        assert storage.requests.counts == {"put": 1}
        assert storage.requests.bytes_written == info.bytes_written


def test_an_abort_costs_nothing(storage: S3Storage) -> None:
    provider = provider_for(storage)
    store = provider.get_store(0)
    store.put(("a",), (1,))
    store.abort()
    assert storage.requests.counts == {}


def test_a_snapshot_is_one_put(storage: S3Storage) -> None:
    provider = provider_for(storage)
    info = committed(provider, 3)[-1]
    storage.requests.reset()
    snap = provider.snapshot(info.version, info.checkpoint_id)
    assert storage.requests.counts == {"put": 1}
    assert storage.requests.bytes_written == snap.bytes_written


def test_a_cold_load_from_a_snapshot_is_one_list_and_one_get(storage: S3Storage) -> None:
    writer = provider_for(storage)
    info = committed(writer, 3)[-1]
    snap = writer.snapshot(info.version, info.checkpoint_id)
    storage.requests.reset()
    fresh = provider_for(storage)  # another process: nothing cached
    assert state_of(fresh, info) == state_of(writer, info)
    assert storage.requests.counts == {"list": 1, "get": 1}
    assert storage.requests.bytes_read == snap.bytes_written


def test_a_cold_load_reads_each_delta_after_the_snapshot_once(storage: S3Storage) -> None:
    writer = provider_for(storage)
    infos = committed(writer, 6)
    writer.snapshot(infos[2].version, infos[2].checkpoint_id)
    storage.requests.reset()
    fresh = provider_for(storage)
    assert state_of(fresh, infos[-1]) == state_of(writer, infos[-1])
    assert storage.requests.counts == {"list": 1, "get": 1 + 3}  # snapshot of v3, deltas 4-6


def test_a_warm_load_rolls_forward_without_listing(storage: S3Storage) -> None:
    """A worker whose cache is 3 versions behind reads only the 3 deltas it missed."""
    behind = provider_for(storage)
    base = committed(behind, 2)[-1]
    ahead = provider_for(storage)
    info = base
    for b in range(3):
        info = commit_rows(ahead, info, {f"later{b}": b})
    storage.requests.reset()
    assert state_of(behind, info) == state_of(ahead, info)
    assert storage.requests.counts == {"get": 3}
