"""The coordinator's records in a real catalog: holders, and which copies are redundant."""

from __future__ import annotations

import logging

import pytest

from state_runtime.catalog import Catalog
from state_runtime.catalog.engine import RetryPolicy, create_catalog_engine
from state_runtime.identity import CheckpointRef, StoreId, new_checkpoint_id
from state_runtime.runtime import coordinator

ROOT = "file:///tmp/coordinator-root"


def test_a_copy_far_behind_another_workers_is_redundant(sqlite_catalog_url: str) -> None:
    with Catalog.open(sqlite_catalog_url, upgrade=True) as catalog:
        a, b, c = StoreId(0, 0), StoreId(0, 1), StoreId(0, 2)
        for store in (a, b, c):
            catalog.register_store(ROOT, store, "k string", "v bigint")
        coordinator.report(catalog, ROOT, a, "host:1", CheckpointRef(12, new_checkpoint_id()))
        coordinator.report(catalog, ROOT, b, "host:1", CheckpointRef(3, new_checkpoint_id()))
        coordinator.report(catalog, ROOT, c, "host:2", CheckpointRef(30, new_checkpoint_id()))
        held_by_2 = {a: 1, b: 1, c: 30}
        # a: worker 1 is 11 versions ahead -> unload; b: only 2 ahead -> keep (roll forward);
        # c: worker 2 holds it itself.
        assert coordinator.redundant(catalog, ROOT, held_by_2, "host:2", lag=10) == {a}
        assert coordinator.redundant(catalog, ROOT, held_by_2, "host:2", lag=2) == {a, b}
        assert coordinator.redundant(catalog, ROOT, {}, "host:2") == set()
        # The latest report wins: worker 2 takes store a over.
        coordinator.report(catalog, ROOT, a, "host:2", CheckpointRef(13, new_checkpoint_id()))
        assert coordinator.redundant(catalog, ROOT, {a: 1}, "host:2", lag=1) == set()
        assert coordinator.redundant(catalog, ROOT, {a: 1}, "host:1", lag=1) == {a}


def test_an_unknown_store_or_a_down_catalog_is_only_logged(
    sqlite_catalog_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Catalog.open(sqlite_catalog_url, upgrade=True) as catalog:
        coordinator.report(
            catalog, ROOT, StoreId(9, 9), "host:1", CheckpointRef(1, new_checkpoint_id())
        )
        assert coordinator.redundant(catalog, ROOT, {StoreId(9, 9): 0}, "host:2", lag=1) == set()
    # Nothing listens on port 1: the coordinator logs and carries on.
    down = Catalog(
        create_catalog_engine("postgresql+psycopg2://postgres@127.0.0.1:1/test"),
        retry=RetryPolicy(attempts=1),
    )
    with caplog.at_level(logging.WARNING, logger="state_runtime.runtime.coordinator"):
        assert coordinator.redundant(down, ROOT, {StoreId(0, 0): 0}, "host:2") == set()
        coordinator.report(
            down, ROOT, StoreId(0, 0), "host:2", CheckpointRef(1, new_checkpoint_id())
        )
    assert [r.message.split(":")[1].strip() for r in caplog.records] == [
        "cannot read store holders",
        "cannot record the holder of 0/0/default",
    ]
