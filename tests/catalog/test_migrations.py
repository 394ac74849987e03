"""Migrations: the schema they build, upgrades that keep data, refusal of old schemas."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from state_runtime.catalog import BatchMetrics, Catalog, Position, RetentionPolicy, head_revision
from state_runtime.catalog.__main__ import main as catalog_main
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import (
    ALEMBIC_INI,
    alembic_config,
    current_revision,
    upgrade,
)
from state_runtime.catalog.schema.tables import metadata
from state_runtime.errors import CatalogError, CatalogSchemaOutdated, CatalogSchemaTooNew
from state_runtime.identity import CheckpointRef, StoreId
from tests.catalog.conftest import FAST_RETRY
from tests.catalog.settled import settled

ID1, ID2, ID2_OLD = "a" * 32, "b" * 32, "c" * 32


def test_migrations_build_exactly_the_declared_tables(empty_url: str) -> None:
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), metadata)
        assert current_revision(connection) == head_revision()
    engine.dispose()
    assert diff == []


def _fill_revision_1(connection: sa.Connection) -> None:
    """What a catalog at revision 0001 holds: a store with two commits (one replayed),
    a maintenance run and a deletion. Plain SQL, shaped like revision 0001's tables."""
    t = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    ts = t.isoformat(sep=" ") if connection.dialect.name == "sqlite" else t
    if connection.dialect.name == "sqlite":
        ts = t.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    run = sa.text(
        "INSERT INTO maintenance_runs (kind, owner, parameters, started_at, ended_at, outcome,"
        " counts) VALUES ('cleanup', 'old-cron', '{}', :t, :t, 'succeeded', '{\"deleted\": 1}')"
    )
    connection.execute(run, {"t": ts})
    connection.execute(
        sa.text(
            "INSERT INTO stores (checkpoint_root, operator_id, partition_id, store_name,"
            " key_schema, created_at, latest_version, latest_checkpoint_id, last_committed_at)"
            " VALUES ('/ckpt', 0, 3, 'default', '\"k STRING\"', :t, 2, :id2, :t)"
        ),
        {"t": ts, "id2": ID2},
    )
    files = sa.text(
        "INSERT INTO checkpoint_files (store_id, path, kind, version, checkpoint_id,"
        " base_checkpoint_id, lineage, size_bytes, rows, file_rows, checksum, created_at,"
        " recorded_at, state, state_changed_at, state_reason, claimed_by_run)"
        " VALUES (1, :path, 'delta', :v, :id, :base, :lineage, 10, 5, 5, :sum, :t, :t, :state,"
        " :t, NULL, :run)"
    )
    for v, cid, base, state, run_id in (
        (1, ID1, None, "committed", None),
        (2, ID2, ID1, "committed", None),
        (2, ID2_OLD, ID1, "deleted", 1),
    ):
        connection.execute(
            files,
            {
                "path": f"state/0/3/default/{v}_{cid}.delta",
                "v": v,
                "id": cid,
                "base": base,
                "lineage": "[]" if base is None else f'[[1, "{ID1}"]]',
                "sum": "e" * 64,
                "t": ts,
                "state": state,
                "run": run_id,
            },
        )
    commit = sa.text(
        "INSERT INTO commit_log (query_id, batch_id, store_id, version, checkpoint_id, file_id,"
        " committed_at) VALUES ('q', :b, 1, :v, :id, :f, :t)"
    )
    connection.execute(commit, {"b": 0, "v": 1, "id": ID1, "f": 1, "t": ts})
    connection.execute(commit, {"b": 1, "v": 2, "id": ID2, "f": 2, "t": ts})
    connection.execute(
        sa.text(
            "INSERT INTO deletion_ledger (file_id, run_id, reason, deleted_at)"
            " VALUES (3, 1, 'orphan (replaced)', :t)"
        ),
        {"t": ts},
    )


def test_revision_1_data_survives_the_upgrade_to_head(empty_url: str) -> None:
    engine = create_catalog_engine(empty_url)
    upgrade(engine, "0001_initial")
    with engine.begin() as connection:
        _fill_revision_1(connection)
    upgrade(engine)
    engine.dispose()

    catalog = Catalog.open(empty_url, retry=FAST_RETRY)
    store = StoreId(0, 3)
    assert catalog.committed_ids("/ckpt", "q", 1) == {store: CheckpointRef(2, ID2)}
    assert catalog.latest_committed("/ckpt") == {store: CheckpointRef(2, ID2)}
    (record,) = catalog.stores()
    assert record.key_schema == "k STRING"
    assert record.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    newest, _ = catalog.retained_versions("/ckpt", store)
    assert [f.version for f in newest.files] == [1, 2] and newest.complete
    (deletion,) = catalog.deletion_history()
    assert deletion.path.endswith(f"2_{ID2_OLD}.delta") and deletion.run_id == 1
    (health,) = catalog.store_health(RetentionPolicy())
    assert health.last_run_id is None and health.live_files == 2
    run = catalog.run(1)
    assert run is not None and run.counts == {"deleted": 1}
    catalog.close()


def test_an_old_schema_is_refused_with_the_command_that_upgrades_it(empty_url: str) -> None:
    url = empty_url.replace("postgres@", "postgres:sekret@")  # trust auth ignores it
    engine = create_catalog_engine(url)
    with pytest.raises(CatalogSchemaOutdated, match="no schema yet") as empty:
        Catalog.open(url, retry=FAST_RETRY)
    upgrade(engine, "0001_initial")
    with pytest.raises(CatalogSchemaOutdated) as old:
        Catalog.open(url, retry=FAST_RETRY)
    engine.dispose()
    message = str(old.value)
    assert "at schema revision 0001_initial" in message
    assert f"needs {head_revision()}" in message
    assert "python -m state_runtime.catalog upgrade --url" in message
    assert "sekret" not in message + str(empty.value)
    with Catalog.open(url, upgrade=True, retry=FAST_RETRY) as upgraded:
        assert upgraded.stores() == []


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    engine = create_catalog_engine(url)
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    with pytest.raises(CatalogError, match="9999_future, which this version") as err:
        Catalog.open(url, retry=FAST_RETRY)
    assert not isinstance(err.value, CatalogSchemaOutdated)


def test_a_newer_schema_is_refused_by_upgrade_too_and_left_alone(empty_url: str) -> None:
    """With or without upgrade=True, and from the command line: the library's typed error
    naming both revisions, never alembic's own exception."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999_future'"))
    for attempt in (
        lambda: Catalog.open(empty_url, upgrade=True, retry=FAST_RETRY),
        lambda: Catalog.open(empty_url, retry=FAST_RETRY),
        lambda: upgrade(engine),
    ):
        with pytest.raises(CatalogSchemaTooNew) as err:
            attempt()
        assert "9999_future" in str(err.value) and head_revision() in str(err.value)
    assert catalog_main(["upgrade", "--url", empty_url]) == 1
    with engine.connect() as connection:
        assert current_revision(connection) == "9999_future"
    engine.dispose()


@pytest.mark.postgres
def test_downgrade_to_base_and_back(pg_schema: str) -> None:
    engine = create_catalog_engine(pg_schema)
    upgrade(engine)
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
        assert sa.inspect(connection).get_table_names() == ["alembic_version"]
    upgrade(engine)
    with engine.connect() as connection:
        assert current_revision(connection) == head_revision()
    engine.dispose()


def test_command_line_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert catalog_main(["upgrade", "--url", url]) == 0
    assert f"revision {head_revision()}" in capfd.readouterr().out
    Catalog.open(url).close()

    # The alembic command line's path: alembic.ini plus env.py, URL from STATE_CATALOG_URL.
    monkeypatch.setenv("STATE_CATALOG_URL", url)
    out = io.StringIO()
    command.current(Config(str(ALEMBIC_INI), stdout=out))
    assert f"{head_revision()} (head)" in out.getvalue()

    assert catalog_main(["current", "--url", "nonsense"]) == 1
    assert "not a valid SQLAlchemy URL" in capfd.readouterr().err


def test_upgrading_to_verified_snapshots_keeps_every_row_and_keeps_more(empty_url: str) -> None:
    """A live catalog at 0005 whose snapshot already replaced a delta: after the upgrade every
    row is still there, the snapshot is unverified (it replaces nothing until validated), and
    cleanup keeps what it would replace; once verified, it counts again."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine, "0005_run_ownership")
    with engine.begin() as connection:
        _fill_revision_1(connection)
        t = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
        ts = t.replace(tzinfo=None) if connection.dialect.name == "sqlite" else t
        connection.execute(
            sa.text(
                "INSERT INTO checkpoint_files (store_id, path, kind, version, checkpoint_id,"
                " base_checkpoint_id, lineage, size_bytes, rows, file_rows, checksum,"
                " created_at, recorded_at, state, state_changed_at)"
                " VALUES (1, :path, 'snapshot', 2, :id, :base, :lineage, 50, 5, 5, :sum,"
                " :t, :t, 'committed', :t)"
            ),
            {
                "path": f"state/0/3/default/2_{ID2}.snapshot",
                "id": ID2,
                "base": ID1,
                "lineage": f'[[1, "{ID1}"]]',
                "sum": "f" * 64,
                "t": ts,
            },
        )
    with engine.connect() as connection:
        before = {
            table: connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("stores", "checkpoint_files", "commit_log", "deletion_ledger")
        }
    upgrade(engine)
    with engine.connect() as connection:
        after = {
            table: connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in before
        }
        states = dict(
            connection.execute(sa.text("SELECT path, verification FROM checkpoint_files")).all()
        )
    engine.dispose()
    assert after == before and set(states.values()) == {"unverified"}

    catalog = Catalog.open(empty_url, retry=FAST_RETRY)
    store, policy = StoreId(0, 3), RetentionPolicy(retain_versions=2)
    later = datetime(2024, 6, 1, tzinfo=UTC)
    assert catalog.deletable_files(policy, root="/ckpt", now=later) == []
    (health,) = catalog.store_health(policy)
    assert health.first_validated_at is None and health.deltas_since_snapshot == 2
    catalog.record_verifications("/ckpt", {f"state/0/3/default/2_{ID2}.snapshot": None})
    newest, _ = catalog.retained_versions("/ckpt", store)
    assert [f.kind.value for f in newest.files] == ["snapshot"]
    deletable = catalog.deletable_files(policy, root="/ckpt", now=later)
    assert [v.file.path for v in deletable] == [f"state/0/3/default/2_{ID2}.delta"]
    catalog.close()


def test_upgrading_drops_the_records_of_versions_that_changed_nothing(empty_url: str) -> None:
    """A catalog at 0013 recorded versions 3 and 4 (which changed nothing) as 0-byte deltas
    whose paths never existed; a false loss was recorded against one, cleanup "deleted" the
    other. After the upgrade their commits name no file, the records, their ledger entry and
    the false problem are gone, and every version loads (health sees no broken store)."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine, "0013_operator_layouts")
    with engine.begin() as connection:
        _fill_revision_1(connection)
        t = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
        ts = t.replace(tzinfo=None) if connection.dialect.name == "sqlite" else t
        idle = sa.text(
            "INSERT INTO checkpoint_files (store_id, path, kind, version, checkpoint_id,"
            " base_checkpoint_id, lineage, size_bytes, rows, file_rows, checksum, created_at,"
            " recorded_at, state, state_changed_at, claimed_by_run)"
            " VALUES (1, :path, 'delta', :v, :id, :id, :lineage, 0, 5, 0, :sum, :t, :t, :state,"
            " :t, :run)"
        )
        for v, state, run in ((3, "committed", None), (4, "deleted", 1)):
            connection.execute(
                idle,
                {
                    "path": f"state/0/3/default/{v}_{ID2}.delta",
                    "v": v,
                    "id": ID2,
                    "lineage": f'[[{v - 1}, "{ID2}"]]',
                    "sum": hashlib.sha256(b"").hexdigest(),
                    "t": ts,
                    "state": state,
                    "run": run,
                },
            )
        for batch, v, file_id in ((2, 3, 4), (3, 4, 5)):
            connection.execute(
                sa.text(
                    "INSERT INTO commit_log (query_id, batch_id, store_id, version,"
                    " checkpoint_id, file_id, committed_at) VALUES ('q', :b, 1, :v, :id, :f, :t)"
                ),
                {"b": batch, "v": v, "id": ID2, "f": file_id, "t": ts},
            )
        connection.execute(
            sa.text(
                "INSERT INTO deletion_ledger (file_id, run_id, reason, deleted_at)"
                " VALUES (5, 1, 'superseded', :t)"
            ),
            {"t": ts},
        )
        connection.execute(
            sa.text(
                "INSERT INTO store_problems (store_id, path, version, problem, detected_at)"
                " VALUES (1, :path, 3, 'storage no longer has it', :t)"
            ),
            {"path": f"state/0/3/default/3_{ID2}.delta", "t": ts},
        )
        connection.execute(
            sa.text("UPDATE stores SET latest_version = 4 WHERE store_id = 1"),
        )
    upgrade(engine)
    with engine.connect() as connection:
        paths = set(connection.execute(sa.text("SELECT path FROM checkpoint_files")).scalars())
        entries = connection.execute(
            sa.text("SELECT version, file_id FROM commit_log ORDER BY version")
        ).all()
    engine.dispose()
    assert paths == {
        f"state/0/3/default/{v}_{i}.delta" for v, i in ((1, ID1), (2, ID2), (2, ID2_OLD))
    }
    assert [tuple(e) for e in entries] == [(1, 1), (2, 2), (3, None), (4, None)]

    catalog = Catalog.open(empty_url, retry=FAST_RETRY)
    store = StoreId(0, 3)
    assert catalog.idle_versions("/ckpt", store) == {3, 4}
    newest, below = catalog.retained_versions("/ckpt", store)
    assert newest.ref == CheckpointRef(4, ID2) and newest.complete and below.complete
    assert [f.version for f in newest.files] == [1, 2]
    assert [d.path for d in catalog.deletion_history()] == [f"state/0/3/default/2_{ID2_OLD}.delta"]
    (health,) = catalog.store_health(RetentionPolicy())
    assert health.open_problems == 0 and health.versions_loadable == 4
    catalog.close()


def test_batches_recorded_before_the_disk_figures_read_zero_after_the_upgrade(
    empty_url: str,
) -> None:
    engine = create_catalog_engine(empty_url)
    upgrade(engine, "0017_intent_sequence")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO batch_metrics (checkpoint_root, query_id, batch_id, rows_in,"
                " keys_updated, state_rows, bytes_written, commit_ms, cache_hits, cache_misses,"
                " extra, recorded_at) VALUES ('/ckpt', 'q', 0, 5, 4, 3, 2, 1.5, 1, 0, '{}',"
                " :at)"
            ),
            {"at": datetime(2026, 11, 1, tzinfo=UTC)},
        )
    upgrade(engine)
    engine.dispose()
    with Catalog.open(empty_url, retry=FAST_RETRY) as catalog:
        (recorded,) = catalog.batch_metrics("/ckpt", "q")
    m = recorded.metrics
    assert (m.rows_in, m.bytes_written, m.cache_hits) == (5, 2, 1)
    assert (m.resident_bytes, m.local_disk_bytes, m.block_cache_hits) == (0, 0, 0)
    assert (m.block_cache_misses, m.compaction_bytes) == (0, 0)
    engine = create_catalog_engine(empty_url)
    with engine.begin() as connection:  # and back: the batch keeps its recorded figures
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0017_intent_sequence")
        columns = {c["name"] for c in sa.inspect(connection).get_columns("batch_metrics")}
        assert "local_disk_bytes" not in columns
        assert connection.execute(sa.text("SELECT rows_in FROM batch_metrics")).scalar() == 5
    engine.dispose()


def test_rows_recorded_before_commit_positions_sort_first_and_an_old_cursor_continues(
    empty_url: str,
) -> None:
    """Before 0020 a reader's cursor was an id: the rows recorded then read transaction 0,
    so the old id is the position (0, id) and the rows after it follow, old then new."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine, "0019_expired_versions")
    at = {"at": datetime(2026, 11, 1, tzinfo=UTC)}
    with engine.begin() as connection:
        for batch in (0, 1):
            connection.execute(
                sa.text(
                    "INSERT INTO batch_metrics (checkpoint_root, query_id, batch_id, rows_in,"
                    " keys_updated, state_rows, bytes_written, commit_ms, cache_hits,"
                    f" cache_misses, extra, recorded_at) VALUES ('/ckpt', 'q', {batch}, 5, 4,"
                    " 3, 2, 1.5, 1, 0, '{}', :at)"
                ),
                at,
            )
        connection.execute(
            sa.text(
                "INSERT INTO maintenance_runs (kind, owner, parameters, started_at, ended_at,"
                " outcome, counts) VALUES ('snapshot', 'ops', '{}', :at, :at, 'succeeded', '{}')"
            ),
            at,
        )
    upgrade(engine)
    engine.dispose()
    with Catalog.open(empty_url, retry=FAST_RETRY) as catalog:
        catalog.record_batch_metrics("/ckpt", "q", 2, BatchMetrics(1, 1, 1, 1, 1.0, 0, 0, {}))
        first, *rest = settled(lambda: catalog.batch_metrics_after(Position()), 3)
        found = catalog.batch_metrics_after(first[0])  # an old cursor: the first batch's id
        [(old, run)] = catalog.runs_after(Position())
    assert first[0] == Position(0, first[0].row) and [b.batch_id for _, b in found] == [1, 2]
    assert found == rest and found[0][0].xact == 0
    new = found[1][0].xact  # the new batch's transaction: 0 on SQLite, one writer at a time
    assert new == 0 if empty_url.startswith("sqlite") else new > 0
    assert old.xact == 0 and run.owner == "ops"
    engine = create_catalog_engine(empty_url)
    with engine.begin() as connection:  # and back: every row kept
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0019_expired_versions")
        columns = {c["name"] for c in sa.inspect(connection).get_columns("batch_metrics")}
        assert "xact_id" not in columns
        assert connection.execute(sa.text("SELECT count(*) FROM batch_metrics")).scalar() == 3
    engine.dispose()


def test_rows_old_code_inserts_after_the_upgrade_are_read_after_the_newer_ones(
    empty_url: str,
) -> None:
    """A rolling upgrade: code from before 0020 keeps inserting rows without ``xact_id``.
    On PostgreSQL they take their transaction's id (a default of 0 would sort them before
    every cursor: never read); on SQLite 0, where the id alone orders them."""
    engine = create_catalog_engine(empty_url)
    upgrade(engine)
    with Catalog.open(empty_url, retry=FAST_RETRY) as catalog:
        catalog.record_batch_metrics("/ckpt", "q", 0, BatchMetrics(1, 1, 1, 1, 1.0, 0, 0, {}))
        catalog.start_run("snapshot", "new-code")
        [(batch, _)] = settled(lambda: catalog.batch_metrics_after(Position()), 1)
        [(run, _)] = settled(lambda: catalog.runs_after(Position()), 1)
        at = {"at": datetime(2026, 11, 1, tzinfo=UTC)}
        with engine.begin() as connection:  # the old code's statements
            connection.execute(
                sa.text(
                    "INSERT INTO batch_metrics (checkpoint_root, query_id, batch_id, rows_in,"
                    " keys_updated, state_rows, bytes_written, commit_ms, cache_hits,"
                    " cache_misses, extra, recorded_at) VALUES ('/ckpt', 'q', 1, 5, 4, 3, 2,"
                    " 1.5, 1, 0, '{}', :at)"
                ),
                at,
            )
            connection.execute(
                sa.text(
                    "INSERT INTO maintenance_runs (kind, owner, parameters, started_at, ended_at,"
                    " outcome, counts) VALUES ('cleanup', 'old-code', '{}', :at, :at,"
                    " 'succeeded', '{}')"
                ),
                at,
            )
        [(old_batch, recorded)] = settled(lambda: catalog.batch_metrics_after(batch), 1)
        [(old_run, started)] = settled(lambda: catalog.runs_after(run), 1)
    engine.dispose()
    assert (recorded.batch_id, started.owner) == (1, "old-code")
    assert old_batch > batch and old_run > run
    postgres = not empty_url.startswith("sqlite")
    assert (old_batch.xact > batch.xact > 0) if postgres else old_batch.xact == 0
    assert (old_run.xact > run.xact > 0) if postgres else old_run.xact == 0
