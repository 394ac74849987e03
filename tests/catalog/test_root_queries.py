"""``root_queries`` (migration 0021): the (root, query) pairs the commit log holds, copied
from it by the upgrade and added by its trigger at every insert, whatever code inserts (a
runtime from before the revision, a bulk copy)."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa
from alembic import command

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import alembic_config, upgrade
from state_runtime.identity import StoreId
from tests.catalog.conftest import FAST_RETRY
from tests.catalog.factory import ROOT, Stream


def _pairs(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        found = connection.exec_driver_sql(
            "SELECT query_id, count(*) FROM root_queries GROUP BY query_id ORDER BY query_id"
        )
        return [tuple(row) for row in found]  # type: ignore[misc]


def test_the_upgrade_copies_the_pairs_and_every_insert_adds_its_own(empty_url: str) -> None:
    """Two queries below three roots, then the table dropped (down to 0020) and the upgrade
    run again: it copies the three pairs from the commit log. A commit log row inserted by
    plain SQL (as code from before the revision would) adds its new pair; one of a known
    pair adds none."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    with Catalog.open(empty_url, retry=FAST_RETRY) as catalog:
        Stream(catalog, [StoreId(0, 0), StoreId(0, 1)], root=f"{ROOT}/a", query="clicks").run(2)
        Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/b", query="clicks").commit()
        Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/c", query="views").commit()
        assert catalog.names_mark().pairs == 3
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0020_commit_positions")
    upgrade(engine)
    assert _pairs(engine) == [("clicks", 2), ("views", 1)]

    insert = (
        "INSERT INTO commit_log (query_id, batch_id, store_id, version, checkpoint_id,"
        " file_id, committed_at) SELECT :query, 9, store_id, :version, :id, NULL, :at FROM stores"
        " WHERE checkpoint_root = (SELECT max(checkpoint_root) FROM stores)"
    )
    with engine.begin() as connection:
        at = connection.exec_driver_sql("SELECT max(committed_at) FROM commit_log").scalar()
        for version, query in enumerate(("taps", "views"), start=9):
            values = {"query": query, "version": version, "id": "f" * 32, "at": at}
            connection.execute(sa.text(insert), values)
    assert _pairs(engine) == [("clicks", 2), ("taps", 1), ("views", 1)]
    engine.dispose()


def test_a_commit_in_flight_during_the_upgrade_adds_its_pair(pg_schema: str) -> None:
    """A commit open while the upgrade runs (code from before the revision inserting into the
    commit log) lands in the copy: the upgrade creates the trigger first, whose lock waits for
    the commit, then copies. Copying first missed it, and its insert fired no trigger."""
    engine = create_catalog_engine(pg_schema)
    upgrade(engine)
    with Catalog.open(pg_schema, retry=FAST_RETRY) as catalog:
        Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/a", query="clicks").commit()
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0020_commit_positions")
    insert = (
        "INSERT INTO commit_log (query_id, batch_id, store_id, version, checkpoint_id,"
        " file_id, committed_at) SELECT 'taps', 9, store_id, 9, :id, NULL, now() FROM stores"
    )
    with engine.connect() as in_flight:
        in_flight.execute(sa.text(insert), {"id": "f" * 32})
        upgrading = threading.Thread(target=upgrade, args=(engine,))
        upgrading.start()
        time.sleep(3)
        in_flight.commit()
    upgrading.join(timeout=60)
    assert not upgrading.is_alive()
    assert _pairs(engine) == [("clicks", 1), ("taps", 1)]
    engine.dispose()
