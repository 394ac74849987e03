"""The coordinator's records in a real catalog: which worker holds each store's copy."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.engine import RetryPolicy, create_catalog_engine
from state_runtime.catalog.tables import store_holders, stores
from state_runtime.identity import CheckpointRef, StoreId, new_checkpoint_id
from state_runtime.runtime import coordinator

ROOT = "file:///tmp/coordinator-root"


def _holders(catalog: Catalog) -> dict[int, tuple[str, int]]:
    query = sa.select(stores.c.partition_id, store_holders.c.worker, store_holders.c.version).join(
        stores, stores.c.store_id == store_holders.c.store_id
    )
    with catalog.engine.connect() as connection:
        return {p: (w, v) for p, w, v in connection.execute(query)}


def test_the_latest_report_names_the_holder(sqlite_catalog_url: str) -> None:
    with Catalog.open(sqlite_catalog_url, upgrade=True) as catalog:
        a, b = StoreId(0, 0), StoreId(0, 1)
        for store in (a, b):
            catalog.register_store(ROOT, store, "k string", "v bigint")
        coordinator.report(catalog, ROOT, a, "host:1", CheckpointRef(12, new_checkpoint_id()))
        coordinator.report(catalog, ROOT, b, "host:1", CheckpointRef(3, new_checkpoint_id()))
        assert _holders(catalog) == {0: ("host:1", 12), 1: ("host:1", 3)}
        # Worker 2 takes store a over.
        coordinator.report(catalog, ROOT, a, "host:2", CheckpointRef(13, new_checkpoint_id()))
        assert _holders(catalog) == {0: ("host:2", 13), 1: ("host:1", 3)}


def test_an_unknown_store_or_a_down_catalog_is_only_logged(
    sqlite_catalog_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Catalog.open(sqlite_catalog_url, upgrade=True) as catalog:
        coordinator.report(
            catalog, ROOT, StoreId(9, 9), "host:1", CheckpointRef(1, new_checkpoint_id())
        )
        assert _holders(catalog) == {}
    # Nothing listens on port 1: the coordinator logs and carries on.
    down = Catalog(
        create_catalog_engine("postgresql+psycopg2://postgres@127.0.0.1:1/test"),
        retry=RetryPolicy(attempts=1),
    )
    with caplog.at_level(logging.WARNING, logger="state_runtime.runtime.coordinator"):
        coordinator.report(
            down, ROOT, StoreId(0, 0), "host:2", CheckpointRef(1, new_checkpoint_id())
        )
    assert [r.message.split(":")[1].strip() for r in caplog.records] == [
        "cannot record the holder of 0/0/default",
    ]
