"""A checkpoint root and its SQLite catalog, moved or copied together, open where they land:
the catalog stores the root relative to its own folder."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import sqlalchemy as sa
from alembic import command

from state_runtime.catalog import Catalog, upgrade
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import alembic_config
from state_runtime.maintenance import Fleet, MaintenancePolicy, run_checks, snapshot_pass
from state_runtime.storage import LocalStorage
from tests.maintenance.conftest import STORES
from tests.maintenance.streams import StoreStream


def stored_roots(database: Path) -> set[str]:
    engine = sa.create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        found = set(connection.exec_driver_sql("SELECT checkpoint_root FROM stores").scalars())
    engine.dispose()
    return found


def test_a_root_and_its_catalog_copied_elsewhere_load_every_version(tmp_path: Path) -> None:
    here = tmp_path / "here"
    catalog = Catalog.open(f"sqlite:///{here / 'catalog.db'}", upgrade=True)
    stream = StoreStream(catalog, LocalStorage(here / "checkpoint"), list(STORES))
    stream.run(6)
    snapshot_pass(Fleet(catalog, owner="tests"), MaintenancePolicy(snapshot_min_deltas=3))
    stream.run(3)
    catalog.close()
    assert stored_roots(here / "catalog.db") == {"./checkpoint"}

    there = tmp_path / "elsewhere" / "copy"
    shutil.copytree(here, there)
    shutil.rmtree(here)  # moved: nothing left where the catalog was written
    with Catalog.open(f"sqlite:///{there / 'catalog.db'}") as moved:
        storage = LocalStorage(there / "checkpoint")
        assert moved.roots() == [storage.uri]
        copy = StoreStream(moved, storage, list(STORES), register=False)
        for store in STORES:
            for version in range(1, 10):
                ref = moved.committed_ids(storage.uri, stream.query, version - 1)[store]
                assert ref == stream.committed[store][version - 1].ref
                loaded = copy.provider(store).get_read_store(version, ref.checkpoint_id)
                rows = {k[0]: v[0] for k, v in loaded.items()}
                assert rows == stream.expected(store, version), (store, version)
        report = run_checks(Fleet(moved, owner="tests"), MaintenancePolicy())
        assert report.ok, [o.summary for o in report.outcomes if not o.passed]
        copy.committed = stream.committed
        copy.states = stream.states
        copy.batch = stream.batch
        copy.run(1)  # and the stream carries on where it landed
        assert {h.latest.version for h in moved.store_health(MaintenancePolicy().retention)} == {10}
    assert stored_roots(there / "catalog.db") == {"./checkpoint"}


def test_upgrade_makes_existing_roots_relative_and_downgrade_restores_them(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db" / "catalog.db"
    with Catalog.open(f"sqlite:///{database}", upgrade=True) as catalog:
        stream = StoreStream(catalog, LocalStorage(database.parent / "ckpt"), list(STORES[:1]))
        stream.run(2)
        outside = StoreStream(catalog, LocalStorage(tmp_path / "outside"), list(STORES[:1]))
        outside.run(1)
    absolute = {stream.root, outside.root}
    engine = create_catalog_engine(f"sqlite:///{database}")
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0006_verified_snapshots")
    assert stored_roots(database) == absolute  # as revision 0006 stored them
    upgrade(engine)
    engine.dispose()
    assert stored_roots(database) == {"./ckpt", outside.root}
    with Catalog.open(f"sqlite:///{database}") as catalog:
        assert set(catalog.roots()) == absolute


def test_catalogs_in_two_folders_store_each_root_relative_to_its_own(tmp_path: Path) -> None:
    """Catalog engines share one cache of compiled statements (statement_cache.py), whose
    root column's processors keep the dialect that compiled them: each catalog, used in
    turn while both are open, must store and read its root against its own folder."""
    with contextlib.ExitStack() as stack:
        streams = []
        for name in ("first", "second"):
            here = tmp_path / name
            url = f"sqlite:///{here / 'catalog.db'}"
            catalog = stack.enter_context(Catalog.open(url, upgrade=True))
            storage = LocalStorage(here / "checkpoint")
            streams.append((catalog, storage, StoreStream(catalog, storage, list(STORES))))
        for _ in range(2):
            for catalog, storage, stream in streams:
                stream.run(1)
                assert catalog.roots() == [storage.uri]
    for name in ("first", "second"):
        assert stored_roots(tmp_path / name / "catalog.db") == {"./checkpoint"}, name
