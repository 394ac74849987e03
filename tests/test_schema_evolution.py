"""The evolution planner's rules, and stores read through a schema history from real files."""

from __future__ import annotations

import pickle
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from state_runtime import StateStoreProvider
from state_runtime.errors import SchemaMismatch
from state_runtime.identity import CheckpointRef, FileKind
from state_runtime.storage import Storage
from state_runtime.store.schema_evolution import SchemaChange, plan, same_schema
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

KEY = "user string"


def S(value: str, key: str = KEY) -> StateSchema:
    return StateSchema.of(key, value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("n tinyint", "n smallint"),
        ("n smallint", "n int"),
        ("n int", "n bigint"),
        ("n tinyint", "n bigint"),
        ("x float", "x double"),
        ("d decimal(10,2)", "d decimal(12,2)"),
        ("d decimal(10,2)", "d decimal(12,4)"),
        ("s struct<a:int,b:float>", "s struct<a:bigint,b:double>"),
        ("l array<int>", "l array<bigint>"),
        ("m map<string,int>", "m map<string,bigint>"),
        ("l array<struct<a:tinyint>>", "l array<struct<a:int>>"),
    ],
)
def test_widenings_are_allowed(old: str, new: str) -> None:
    projection = plan(S(old), S(new))
    assert any(a.startswith("widen value field") for a in projection.actions)


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ("n bigint", "n int", "not a widening"),
        ("x double", "x float", "not a widening"),
        ("n int", "n double", "not a widening"),
        ("n int", "n string", "not a widening"),
        ("d decimal(12,2)", "d decimal(10,2)", "not a widening"),
        ("d decimal(10,2)", "d decimal(10,4)", "not a widening"),
        ("s struct<a:int>", "s struct<a:int,b:int>", "nested struct fields"),
        ("l array<bigint>", "l array<int>", "not a widening"),
        ("n bigint", "n bigint not null", "NOT NULL"),
    ],
)
def test_narrowing_and_other_type_changes_are_refused(old: str, new: str, rule: str) -> None:
    with pytest.raises(SchemaMismatch) as err:
        plan(S(old), S(new))
    assert rule in err.value.reason and "value field" in err.value.reason


def test_additions_need_nullability_or_a_default() -> None:
    projection = plan(S("n bigint"), S("n bigint, m bigint"))
    assert projection.actions == ("add value field m bigint (null for older rows)",)
    assert plan(
        S("n bigint"), S("n bigint, m bigint not null"), SchemaChange(defaults={"m": 7})
    ).actions == ("add value field m bigint (7 for older rows)",)
    with pytest.raises(SchemaMismatch, match="'m' is added NOT NULL without a default"):
        plan(S("n bigint"), S("n bigint, m bigint not null"))
    filled = plan(S("n bigint"), S("n bigint, m bigint not null"), SchemaChange(defaults={"m": 7}))
    assert filled.fills == (None, 7)
    with pytest.raises(SchemaMismatch, match="default 'x' for value field 'm' does not fit"):
        plan(S("n bigint"), S("n bigint, m bigint"), SchemaChange(defaults={"m": "x"}))


def test_renames_and_drops_must_be_declared() -> None:
    with pytest.raises(SchemaMismatch) as err:
        plan(S("amount bigint, n bigint"), S("total bigint, n bigint"))
    reason = err.value.reason
    assert "value field 'amount' is missing from the new schema: an undeclared drop or rename" in (
        reason
    )
    assert "renamed={'amount'" in reason
    renamed = plan(
        S("amount bigint, n bigint"),
        S("total bigint, n bigint"),
        SchemaChange(renamed={"amount": "total"}),
    )
    assert renamed.value_sources == (0, 1)
    dropped = plan(S("amount bigint, n bigint"), S("n bigint"), SchemaChange(dropped=("amount",)))
    assert dropped.value_sources == (1,)
    with pytest.raises(SchemaMismatch, match="no field 'nope' to rename"):
        plan(S("n bigint"), S("m bigint"), SchemaChange(renamed={"nope": "m"}))


def test_keys_may_only_be_renamed() -> None:
    assert plan(
        S("n bigint"), S("n bigint", key="name string"), SchemaChange(renamed={"user": "name"})
    )
    with pytest.raises(SchemaMismatch, match="undeclared rename"):
        plan(S("n bigint"), S("n bigint", key="name string"))
    with pytest.raises(SchemaMismatch, match="key types cannot change"):
        plan(S("n bigint", key="id int"), S("n bigint", key="id bigint"))
    with pytest.raises(SchemaMismatch, match="key fields cannot be added or removed"):
        plan(S("n bigint"), S("n bigint", key="user string, day int"))
    with pytest.raises(SchemaMismatch, match="key field 'user' cannot be dropped"):
        plan(S("n bigint"), S("n bigint"), SchemaChange(dropped=("user",)))


def test_every_problem_is_named_once_in_one_message() -> None:
    with pytest.raises(SchemaMismatch) as err:
        plan(
            S("a bigint, b int, c double", key="id int"),
            S("b smallint, c float, d int not null", key="id bigint"),
        )
    reason = err.value.reason
    for expected in (
        "'a' is missing",
        "'b': int -> smallint",
        "'c': double -> float",
        "value field 'd' is added",
        "allowed widenings",
        "key field 'id'",
    ):
        assert reason.count(expected) == 1, (expected, reason)


def test_projection_renames_casts_and_fills_in_arrow() -> None:
    old = S("amount int, gone string, n tinyint")
    new = S("total bigint, n bigint, d decimal(5,1) not null, extra double")
    projection = plan(
        old,
        new,
        SchemaChange(renamed={"amount": "total"}, dropped=("gone",), defaults={"d": "1.5"}),
    )
    keys = pa.array([{"user": "a"}, {"user": "b"}], type=old.key_arrow)
    values = pa.array(
        [{"amount": 5, "gone": "x", "n": 1}, None], type=old.value_arrow
    )  # the second row is a removal: it stays one
    out_keys, out_values = projection.apply(keys, values)
    assert out_values.type == new.value_arrow and out_keys.type == new.key_arrow
    assert out_values.to_pylist() == [
        {"total": 5, "n": 1, "d": Decimal("1.5"), "extra": None},
        None,
    ]


def _commit(
    provider: StateStoreProvider, base: tuple[int, str | None], rows: dict[str, tuple[Any, ...]]
) -> tuple[int, str | None]:
    store = provider.get_store(*base)
    for k, v in rows.items():
        store.put((k,), v)
    info = store.commit()
    return info.version, info.checkpoint_id


def _provider(storage: Storage, history: SchemaHistory) -> StateStoreProvider:
    return StateStoreProvider(storage, 0, 0, history=history)


def _state(provider: StateStoreProvider, ref: tuple[int, str | None]) -> dict[str, tuple[Any, ...]]:
    return {k[0]: v for k, v in provider.get_read_store(*ref).items()}


def test_files_of_every_schema_load_under_the_newest_and_as_written(storage: Storage) -> None:
    h1 = SchemaHistory.of(S("amount int"))
    v1 = _commit(_provider(storage, h1), (0, None), {"a": (1,), "b": (2,)})
    h2, _ = h1.evolve(S("total bigint, seen bigint"), SchemaChange(renamed={"amount": "total"}), 1)
    v2 = _commit(_provider(storage, h2), v1, {"c": (3, 30)})
    h3, _ = h2.evolve(S("total bigint"), SchemaChange(dropped=("seen",)), 2)
    v3 = _commit(_provider(storage, h3), v2, {"a": (10,)})
    newest = _provider(storage, h3)
    assert _state(newest, v1) == {"a": (1,), "b": (2,)}
    assert _state(newest, v2) == {"a": (1,), "b": (2,), "c": (3,)}
    assert _state(newest, v3) == {"a": (10,), "b": (2,), "c": (3,)}
    as_of_2 = newest.as_of(h2.newest.schema_id)
    assert _state(as_of_2, v2) == {"a": (1, None), "b": (2, None), "c": (3, 30)}
    # A snapshot of version 2 is written under version 2's schema, so it still reads as written;
    # one of version 3 under the newest.
    assert newest.snapshot(*v2).path.endswith(".snapshot")
    assert _state(_provider(storage, h2), v2) == {"a": (1, None), "b": (2, None), "c": (3, 30)}
    header = newest.read_header(CheckpointRef(*v2), FileKind.SNAPSHOT)
    assert header.schema_id == h2.newest.schema_id
    assert _state(_provider(storage, h3), v2) == {"a": (1,), "b": (2,), "c": (3,)}


def test_a_history_that_does_not_know_a_newer_file_refuses_it(storage: Storage) -> None:
    h1 = SchemaHistory.of(S("n int"))
    v1 = _commit(_provider(storage, h1), (0, None), {"a": (1,)})
    h2, _ = h1.evolve(S("m int"), SchemaChange(renamed={"n": "m"}), 1)
    v2 = _commit(_provider(storage, h2), v1, {"b": (2,)})
    with pytest.raises(SchemaMismatch) as err:
        _provider(storage, h1).get_read_store(*v2)
    assert err.value.path is not None and err.value.path.endswith(".delta")
    assert "undeclared drop or rename" in err.value.reason


def test_files_without_a_schema_id_read_as_their_fields_say(storage: Storage) -> None:
    """A store opened without the catalog (a one-schema history) still reads older files whose
    schema differs only by appended nullable fields or widenings."""
    v1 = _commit(
        StateStoreProvider(storage, 0, 0, key_schema=KEY, value_schema="n int"),
        (0, None),
        {"a": (1,)},
    )
    wider = StateStoreProvider(storage, 0, 0, key_schema=KEY, value_schema="n bigint, m string")
    assert _state(wider, v1) == {"a": (1, None)}


def test_a_dropped_field_added_again_is_a_new_field(storage: Storage) -> None:
    """Ids name a point of a history: the re-added field does not bring back the old values."""
    h1 = SchemaHistory.of(S("n int, x int"))
    v1 = _commit(_provider(storage, h1), (0, None), {"a": (1, 7)})
    h2, _ = h1.evolve(S("n int"), SchemaChange(dropped=("x",)), 1)
    h3, _ = h2.evolve(S("n int, x int"), None, 2)
    assert h3.newest.schema_id != h1.newest.schema_id
    assert same_schema(h3.newest.schema, h1.newest.schema)
    assert _state(_provider(storage, h3), v1) == {"a": (1, None)}
    assert _state(_provider(storage, h3).as_of(h1.newest.schema_id), v1) == {"a": (1, 7)}


def test_a_history_travels_to_tasks_without_its_cache() -> None:
    history, _ = SchemaHistory.of(S("n int")).evolve(S("n bigint"), None, 1)
    history.projection(None, S("n int"))  # planned and cached
    copy = pickle.loads(pickle.dumps(history))
    assert copy == history and copy.projection(None, S("n int")).actions == (
        "widen value field n: int -> bigint",
    )
