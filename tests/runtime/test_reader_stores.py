"""Which store the state readers read, checked on the driver before any Spark job: an unknown
store or state variable is named with the operator's stores (a ``transform_with_state``
operator's by variable name), never blamed on uncommitted batches; ``store_of`` refuses
ambiguous choices. No Spark: ``state_plan`` and ``changes_plan`` are the readers' driver
side, run against a real SQLite catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument
from state_runtime.runtime.changes import changes_plan
from state_runtime.runtime.reader import state_plan, store_of
from state_runtime.runtime.tws import TIMERS_STORE
from state_runtime.storage import Storage, open_storage
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

TWS, PLAIN = 0, 1  # a transform_with_state operator (variables and timers) and an aggregation


@pytest.fixture
def storage(tmp_path: Path, sqlite_catalog_url: str) -> Storage:
    """A checkpoint root whose catalog records the stores of both operators."""
    storage = open_storage(str(tmp_path / "ckpt"))
    stores = [(TWS, "count"), (TWS, "amounts"), (TWS, TIMERS_STORE), (PLAIN, "default")]
    with Catalog.open(sqlite_catalog_url, upgrade="sqlite") as catalog:
        for operator_id, name in stores:
            history = SchemaHistory.of(StateSchema.of("k string", "n bigint"))
            catalog.record_schema_history(storage.uri, operator_id, name, history)
    return storage


def _plans(storage: Storage, url: str, operator_id: int, store: str) -> list[str]:
    """The messages of both readers' driver sides reading ``store``."""
    messages = []
    with pytest.raises(InvalidArgument) as state:
        state_plan(
            storage, operator_id, store, batch_id=None, query_id=None, version=None, catalog_url=url
        )
    messages.append(str(state.value))
    with pytest.raises(InvalidArgument) as changes:
        changes_plan(storage, operator_id, 0, 1, store_name=store, query_id=None, catalog_url=url)
    messages.append(str(changes.value))
    return messages


@pytest.mark.parametrize("store", ["nope", "default"])
def test_an_unknown_variable_lists_the_operators_variables_and_timers(
    storage: Storage, sqlite_catalog_url: str, store: str
) -> None:
    """``state_variable="nope"``, or no variable at all (the ``default`` store), on a
    ``transform_with_state`` operator: both readers name it and list what can be read."""
    for message in _plans(storage, sqlite_catalog_url, TWS, store):
        assert f"operator {TWS} below {storage.uri} has no state variable {store!r}" in message
        assert "state variables ('amounts', 'count') with state_variable=" in message
        assert "its timers with timers=True" in message
        assert "not committed" not in message


def test_an_unknown_store_lists_the_operators_stores(
    storage: Storage, sqlite_catalog_url: str
) -> None:
    for message in _plans(storage, sqlite_catalog_url, PLAIN, "nope"):
        assert "has no store 'nope'; its stores: 'default'" in message
    for message in _plans(storage, sqlite_catalog_url, 7, "default"):
        assert message.endswith(f"the catalog records no store of operator 7 below {storage.uri}")


def test_a_known_store_reaches_the_commit_checks(storage: Storage, sqlite_catalog_url: str) -> None:
    """A store the catalog knows but never committed is reported as uncommitted, as before."""
    state, changes = _plans(storage, sqlite_catalog_url, TWS, "count")
    assert f"no committed state for operator {TWS}, store count below" in state
    assert changes.endswith(f"batches [0, 1] of operator {TWS} are not committed in the catalog")


def test_store_of_refuses_ambiguous_or_empty_choices() -> None:
    assert store_of("default", "count", False) == "count"
    assert store_of("default", None, True) == TIMERS_STORE
    assert store_of("aggregates", None, False) == "aggregates"
    with pytest.raises(InvalidArgument, match="not ''"):
        store_of("default", "", False)
    with pytest.raises(InvalidArgument, match="store_name='left' or state_variable='count'"):
        store_of("left", "count", False)
    with pytest.raises(InvalidArgument, match="store_name='left' or timers=True"):
        store_of("left", None, True)
    with pytest.raises(InvalidArgument, match="not both"):
        store_of("default", "count", True)
