"""The store's API: reads, updates, commit, abort, scans, schemas, cache and metrics."""

from __future__ import annotations

import pyarrow as pa
import pytest

from state_runtime import LoadSource, StateStoreProvider, StoreConfig
from state_runtime.errors import InvalidArgument, SchemaMismatch, StoreClosed
from state_runtime.storage import Storage

from .store_helpers import commit_rows, provider_for, state_of

pytestmark = pytest.mark.usefixtures("state_mode")  # in memory, then on disk


def test_version_zero_is_empty_and_first_commit_is_version_one(storage: Storage) -> None:
    provider = provider_for(storage)
    store = provider.get_store(0)
    assert store.version == 0 and store.checkpoint_id is None
    assert list(store.items()) == [] and len(store) == 0
    store.put(("a",), (1,))
    store.put("b", 2)  # a bare scalar is accepted for a one-column schema
    assert store.get("a") == (1,) and store.get(("b",)) == (2,) and store.get("zz") is None
    info = store.commit()
    assert (info.version, info.rows, info.file_rows, info.base_checkpoint_id) == (1, 2, 2, None)
    assert info.path == f"state/0/0/default/1_{info.checkpoint_id}.delta"
    assert storage.exists(info.path)
    assert info.bytes_written == storage.size(info.path)
    assert store.has_committed


def test_reload_from_files_in_a_fresh_provider(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1, "b": 2})
    v2 = commit_rows(p, v1, {"c": 3}, removes=("a",))
    v3 = commit_rows(p, v2, {"b": 20})
    fresh = provider_for(storage)
    store = fresh.get_read_store(3, v3.checkpoint_id)
    assert store.metrics.load.source is LoadSource.FILES
    assert store.metrics.load.deltas_applied == 3
    assert {k[0]: v[0] for k, v in store.items()} == {"b": 20, "c": 3}
    assert state_of(provider_for(storage), v2) == {"b": 2, "c": 3}
    assert state_of(provider_for(storage), v1) == {"a": 1, "b": 2}


def test_updates_lists_this_versions_changes_only(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1, "b": 2})
    store = p.get_store(1, v1.checkpoint_id)
    store.put("c", 3)
    store.remove("a")
    store.put("b", 5)
    assert dict(store.updates()) == {("c",): (3,), ("a",): None, ("b",): (5,)}
    assert len(store) == 2
    assert sorted(store.items()) == [(("b",), (5,)), (("c",), (3,))]


def test_commit_with_no_updates_is_a_valid_new_version(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = p.get_store(1, v1.checkpoint_id).commit()
    assert (v2.version, v2.rows, v2.file_rows) == (2, 1, 0)
    assert state_of(provider_for(storage), v2) == {"a": 1}


def test_put_or_remove_after_commit_or_abort_raises(storage: Storage) -> None:
    p = provider_for(storage)
    store = p.get_store(0)
    store.put("a", 1)
    store.commit()
    for action in (lambda: store.put("b", 2), lambda: store.remove("a"), store.commit):
        with pytest.raises(StoreClosed):
            action()
    aborted = p.get_store(0)
    aborted.abort()
    with pytest.raises(StoreClosed, match="aborted"):
        aborted.put("x", 1)
    aborted.abort()  # idempotent


def test_abort_makes_nothing_visible_and_reopening_gives_the_same_version(
    storage: Storage,
) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    before = sorted(f.path for f in storage.list("state"))
    store = p.get_store(1, v1.checkpoint_id)
    store.put("a", 100)
    store.put("b", 2)
    store.abort()
    assert sorted(f.path for f in storage.list("state")) == before
    assert state_of(p, v1) == {"a": 1}
    assert state_of(provider_for(storage), v1) == {"a": 1}


def test_remove_where_and_batch_apply(storage: Storage) -> None:
    p = provider_for(storage)
    store = p.get_store(0)
    store.apply(puts=[((f"k{i}",), (i,)) for i in range(10)], removes=[("k0",)])
    assert len(store) == 9
    assert store.remove_where(lambda k, v: v[0] % 2 == 0) == 4
    info = store.commit()
    assert state_of(provider_for(storage), info) == {f"k{i}": i for i in (1, 3, 5, 7, 9)}


def test_apply_arrow_puts_and_removes(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1, "b": 2})
    store = p.get_store(1, v1.checkpoint_id)
    batch = pa.record_batch(
        {
            "key": pa.array([{"user": "a"}, {"user": "c"}], type=p.schema.key_arrow),
            "value": pa.array([None, {"count": 3}], type=p.schema.value_arrow),
        }
    )
    store.apply_arrow(batch)
    assert state_of(provider_for(storage), store.commit()) == {"b": 2, "c": 3}
    with pytest.raises(InvalidArgument, match="arrow data must have"):
        p.get_store(0).apply_arrow(pa.record_batch({"x": [1]}))


def test_prefix_and_range_scans_in_key_order(storage: Storage) -> None:
    p = StateStoreProvider(
        storage, 1, 0, key_schema="user string, day int", value_schema="n bigint"
    )
    store = p.get_store(0)
    for user in ("bob", "alice", "carol"):
        for day in (3, 1, 2):
            store.put((user, day), (day * 10,))
    assert [k for k, _ in store.prefix_scan(("alice",))] == [
        ("alice", 1),
        ("alice", 2),
        ("alice", 3),
    ]
    assert [k for k, _ in store.prefix_scan("bob")] == [("bob", 1), ("bob", 2), ("bob", 3)]
    assert [k for k, _ in store.range_scan(("alice", 2), ("bob", 2))] == [
        ("alice", 2),
        ("alice", 3),
        ("bob", 1),
    ]
    assert [k for k, _ in store.range_scan("carol")] == [("carol", 1), ("carol", 2), ("carol", 3)]
    with pytest.raises(InvalidArgument):
        list(store.prefix_scan(("a", 1, "too long")))


def test_a_clustered_prefix_scan_reads_one_range_and_equals_a_full_pass(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``scan_prefix=2`` (a transform_with_state grouping key of two fields), a prefix
    scan of two or more fields finds its rows by binary search in each run (never a pass
    over the state) and returns what an unclustered store returns, over a snapshot, deltas,
    removals and this version's own changes; the files are the same either way."""
    schema = {"key_schema": "part int, user string, i bigint", "value_schema": "n bigint"}
    config = StoreConfig(scan_prefix=2)
    clustered = StateStoreProvider(storage, 1, 0, **schema, config=config)  # type: ignore[arg-type]
    ref = None
    for version in range(4):
        store = clustered.get_store(version, ref)
        for u in range(20):
            for i in range(version, version + 3):
                store.put((u % 2, f"u{u}" if u != 7 else None, i), (version,))
            store.remove((u % 2, f"u{u}" if u != 7 else None, version))
        ref = store.commit().checkpoint_id
        if version == 1:
            clustered.snapshot(2, ref)
    store = clustered.get_store(4, ref)
    store.put((1, "u3", 99), (9,))
    store.remove((1, "u3", 4))
    plain = StateStoreProvider(storage, 1, 0, **schema).get_store(4, ref)  # type: ignore[arg-type]
    fresh = StateStoreProvider(storage, 1, 0, **schema, config=config).get_store(4, ref)  # type: ignore[arg-type]
    for reader in (store, fresh):
        monkeypatch.setattr(reader, "_blocks", lambda: pytest.fail("a pass over the state"))
    for prefix in [(1, "u3"), (1, None), (0, "u4", 5), (0, "nobody")]:
        expected = list(plain.prefix_scan(prefix))
        if prefix == (1, "u3"):
            expected = [r for r in expected if r[0][2] != 4] + [((1, "u3", 99), (9,))]
        assert list(store.prefix_scan(prefix)) == expected
        assert list(fresh.prefix_scan(prefix)) == list(plain.prefix_scan(prefix))
    assert [k for k, _ in fresh.prefix_scan((1, "u3"))] == [(1, "u3", i) for i in (4, 5)]
    monkeypatch.undo()  # a prefix shorter than the clustering one: a pass
    assert list(fresh.prefix_scan((1,))) == list(plain.prefix_scan((1,)))


def test_a_prefix_scan_matches_a_null_key_field(storage: Storage) -> None:
    """A null leading key field (a null grouping key of transform_with_state) is a prefix
    like any other; a range scan still refuses it (nulls have no order)."""
    p = StateStoreProvider(
        storage, 1, 0, key_schema="user string, i bigint", value_schema="n bigint"
    )
    store = p.get_store(0)
    for user, i in ((None, 1), ("a", 0), (None, 0)):
        store.put((user, i), (i,))
    assert [k for k, _ in store.prefix_scan((None,))] == [(None, 0), (None, 1)]
    committed = p.get_store(1, store.commit().checkpoint_id)
    assert [k for k, _ in committed.prefix_scan((None,))] == [(None, 0), (None, 1)]
    with pytest.raises(InvalidArgument, match="holds None"):
        list(committed.range_scan((None,)))


def test_wrong_arity_is_refused(storage: Storage) -> None:
    store = provider_for(storage).get_store(0)
    with pytest.raises(InvalidArgument, match="has 2 fields"):
        store.put(("a", "b"), (1,))
    with pytest.raises(InvalidArgument, match="value"):
        store.put("a", [1])


def test_values_that_do_not_fit_the_schema_fail_the_commit_cleanly(storage: Storage) -> None:
    from state_runtime.errors import CannotCommit

    p = provider_for(storage)
    store = p.get_store(0)
    store.put("a", ("not a number",))
    with pytest.raises(CannotCommit, match="version=1"):
        store.commit()
    assert list(storage.list("state")) == []
    with pytest.raises(StoreClosed):
        store.put("b", 1)


def test_schema_mismatch_names_both_schemas(storage: Storage) -> None:
    v1 = commit_rows(provider_for(storage), None, {"a": 1})
    other_key = StateStoreProvider(
        storage, 0, 0, key_schema="user bigint", value_schema="count bigint"
    )
    with pytest.raises(SchemaMismatch, match=r"user:string.*user:bigint"):
        other_key.get_store(1, v1.checkpoint_id)
    other_value = StateStoreProvider(
        storage, 0, 0, key_schema="user string", value_schema="total double"
    )
    with pytest.raises(SchemaMismatch, match=r"count:bigint.*total:double"):
        other_value.get_store(1, v1.checkpoint_id)


def test_appending_a_nullable_value_column_is_allowed(storage: Storage) -> None:
    v1 = commit_rows(provider_for(storage), None, {"a": 1})
    wider = StateStoreProvider(
        storage, 0, 0, key_schema="user string", value_schema="count bigint, last string"
    )
    store = wider.get_store(1, v1.checkpoint_id)
    assert store.get("a") == (1, None)
    store.put("b", (2, "x"))
    v2 = store.commit()
    assert sorted(wider.get_read_store(2, v2.checkpoint_id).items()) == [
        (("a",), (1, None)),
        (("b",), (2, "x")),
    ]
    not_null = StateStoreProvider(
        storage, 0, 0, key_schema="user string", value_schema="count bigint, last string not null"
    )
    with pytest.raises(SchemaMismatch):
        not_null.get_store(1, v1.checkpoint_id)


def test_cache_serves_a_retry_without_reading_files(storage: Storage) -> None:
    p = provider_for(storage, cached_versions=3)
    v1 = commit_rows(p, None, {"a": 1})
    v2 = commit_rows(p, v1, {"b": 2})
    storage.requests.reset()
    retry = p.get_store(1, v1.checkpoint_id)  # a retried task reopens version 1
    assert retry.metrics.load.source is LoadSource.CACHE
    assert storage.requests.counts == {}
    assert {k[0] for k, _ in retry.items()} == {"a"}
    # The retry commits another version 2; both version-2 attempts stay readable.
    retry.put("c", 3)
    v2b = retry.commit()
    assert v2b.version == 2 and v2b.checkpoint_id != v2.checkpoint_id
    assert state_of(p, v2) == {"a": 1, "b": 2}
    assert state_of(p, v2b) == {"a": 1, "c": 3}
    assert state_of(provider_for(storage), v2) == {"a": 1, "b": 2}


def test_roll_forward_reads_only_the_missed_deltas(storage: Storage) -> None:
    writer = provider_for(storage)
    behind = provider_for(storage)
    v1 = commit_rows(writer, None, {f"k{i}": i for i in range(100)})
    assert state_of(behind, v1)["k5"] == 5  # behind caches version 1
    v2 = commit_rows(writer, v1, {"k1": -1})
    v3 = commit_rows(writer, v2, {"k2": -2}, removes=("k3",))
    storage.requests.reset()
    store = behind.get_store(3, v3.checkpoint_id)
    load = store.metrics.load
    assert load.source is LoadSource.ROLL_FORWARD
    assert (load.files_read, load.deltas_applied) == (2, 2)
    counts = storage.requests.counts
    assert sum(counts.values()) == 2 and "list" not in counts  # two reads, nothing else
    got = {k[0]: v[0] for k, v in store.items()}
    assert got["k1"] == -1 and got["k2"] == -2 and "k3" not in got and len(got) == 99


def test_roll_forward_does_not_copy_the_state(storage: Storage) -> None:
    """Opening v+1 from cached v reuses the same base run (O(changes), no copy)."""
    p = provider_for(storage)
    v1 = commit_rows(p, None, {f"k{i}": i for i in range(1000)})
    base = p.get_read_store(1, v1.checkpoint_id)
    data_before = base._version.base
    v2 = commit_rows(p, v1, {"k1": 0})
    after = p.get_read_store(2, v2.checkpoint_id)
    assert after._version.base is data_before
    assert base.get("k1") == (1,) and after.get("k1") == (0,)  # old version still correct


def test_copy_off_the_lineage_is_not_used(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    branch_a = commit_rows(p, v1, {"a": 2})
    other = provider_for(storage)
    branch_b = commit_rows(other, v1, {"a": 3})  # another attempt at version 2
    v3 = commit_rows(other, branch_b, {"b": 1})
    # p caches branch_a (version 2, another id): loading v3 must not build on it.
    assert state_of(p, branch_a) == {"a": 2}
    assert state_of(p, v3) == {"a": 3, "b": 1}


def test_metrics_report_rows_updates_and_bytes(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1, "b": 2, "c": 3})
    store = p.get_store(1, v1.checkpoint_id)
    store.put("d", 4)
    store.remove("a")
    info = store.commit()
    m = store.metrics
    assert (m.rows, m.updated_keys, m.removed_keys) == (3, 1, 1)
    assert m.bytes_written == info.bytes_written > 0 and m.commit_ms > 0
    assert set(info.timings_ms) == {"load", "commit"}


def test_config_floor_of_two_retained_versions() -> None:
    with pytest.raises(InvalidArgument, match="at least 2"):
        StoreConfig(min_versions_to_retain=1)


def test_version_resolution_by_version_alone(storage: Storage) -> None:
    p = provider_for(storage)
    v1 = commit_rows(p, None, {"a": 1})
    assert provider_for(storage).get_read_store(1).checkpoint_id == v1.checkpoint_id
    commit_rows(provider_for(storage), v1, {"x": 1})
    commit_rows(provider_for(storage), v1, {"y": 1})  # two attempts at version 2
    from state_runtime.errors import UnknownCheckpointId

    with pytest.raises(UnknownCheckpointId, match="2 candidates"):
        provider_for(storage).get_read_store(2)
    committed = StateStoreProvider(
        storage,
        0,
        0,
        key_schema="user string",
        value_schema="count bigint",
        resolve_id=lambda store, version: v1.checkpoint_id if version == 1 else None,
    )
    assert committed.get_read_store(1).checkpoint_id == v1.checkpoint_id
    with pytest.raises(UnknownCheckpointId, match="no committed checkpoint id"):
        committed.get_read_store(2)


def test_nested_and_typed_values_round_trip(storage: Storage) -> None:
    import datetime as dt
    from decimal import Decimal

    p = StateStoreProvider(
        storage,
        2,
        0,
        key_schema="id bigint, day date",
        value_schema="tags array<string>, attrs map<string,int>, amount decimal(10,2), "
        "pos struct<x: double, y: double>, raw binary, ok boolean",
    )
    store = p.get_store(0)
    key = (7, dt.date(2026, 11, 21))
    value = (["a", "b"], {"x": 1}, Decimal("12.34"), (1.5, -2.0), b"\x00\x01", True)
    store.put(key, value)
    info = store.commit()
    fresh = StateStoreProvider(storage, 2, 0, key_schema=p.schema.key, value_schema=p.schema.value)
    # Read back from files exactly as it was put: structs as tuples, maps as dicts.
    assert fresh.get_read_store(1, info.checkpoint_id).get(key) == value


def test_a_cached_copy_behind_cleaned_deltas_loads_from_the_snapshot(storage: Storage) -> None:
    from datetime import timedelta

    from state_runtime.store.file_cleanup import cleanup

    writer, behind = provider_for(storage), provider_for(storage)
    infos = [commit_rows(writer, None, {"a": 1})]
    assert state_of(behind, infos[0]) == {"a": 1}  # behind caches version 1
    for i in range(2, 6):
        infos.append(commit_rows(writer, infos[-1], {f"k{i}": i}))
    writer.snapshot(4, infos[3].checkpoint_id)
    report = cleanup(writer, infos[-1].ref, min_age=timedelta(0), dry_run=False)
    assert infos[1].path in report.deleted  # the delta behind's copy would need
    store = behind.get_read_store(5, infos[-1].checkpoint_id)
    assert {k[0] for k, _ in store.items()} == {"a", "k2", "k3", "k4", "k5"}
    assert store.metrics.load.source is LoadSource.FILES
    assert "cannot roll forward" in store.metrics.load.repairs[0]
