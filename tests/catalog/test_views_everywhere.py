"""The operators' views of revision 0007 on SQLite and PostgreSQL: health (with the status),
history, lineage, deletions and the cleanup preview give what the library gives."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.identity import StoreId
from state_runtime.maintenance import MaintenancePolicy
from tests.catalog.factory import ROOT, Stream
from tests.catalog.test_status_sql import A, C, build_fleet, python_status


def rows(catalog: Catalog, sql: str) -> list[Any]:
    with catalog.engine.connect() as connection:
        return list(connection.execute(sa.text(sql)).all())


def when(value: object) -> datetime | None:
    """A timestamp as the view gives it (SQLite: UTC text) as an aware datetime."""
    if value is None or isinstance(value, datetime):
        return value.astimezone(UTC) if isinstance(value, datetime) else None
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def test_health_view_shows_the_status_python_gives(catalog: Catalog) -> None:
    fleet = build_fleet(catalog)
    defaults = MaintenancePolicy()
    python = python_status(catalog, defaults.lag_warn_deltas, defaults.orphan_warn_files)
    view = {
        StoreId(r.operator_id, r.partition_id, r.store_name): (
            r.status,
            r.status_reason,
            when(r.status_since),
        )
        for r in rows(catalog, "SELECT * FROM state_store_health")
    }
    assert view == python
    assert {s: v[0] for s, v in view.items()} == {s: v.value for s, v in fleet.expected.items()}
    health = {h.key.store: h for h in catalog.store_health(RetentionPolicy())}
    for r in rows(catalog, "SELECT * FROM state_store_health"):
        h = health[StoreId(r.operator_id, r.partition_id, r.store_name)]
        assert (r.latest_version, r.deltas_since_snapshot, r.live_files, r.orphan_files) == (
            h.latest.version,
            h.deltas_since_snapshot,
            h.live_files,
            h.orphan_files,
        )


def test_cleanup_preview_is_the_python_rule_at_the_default_policy(catalog: Catalog) -> None:
    build_fleet(catalog)
    python = {v.file.path: v for v in catalog.file_verdicts(RetentionPolicy())}
    view = {r.path: r for r in rows(catalog, "SELECT * FROM state_cleanup_preview")}
    assert {p: r.verdict for p, r in view.items()} == {
        p: v.verdict.value for p, v in python.items()
    }
    if catalog.dialect == "sqlite":  # PostgreSQL's function words some reasons more briefly
        assert {p: r.reason for p, r in view.items()} == {p: v.reason for p, v in python.items()}
    assert any(r.verdict.startswith("deletable") for r in view.values())


def test_history_lineage_and_deletions(catalog: Catalog) -> None:
    build_fleet(catalog)
    history = rows(
        catalog,
        "SELECT * FROM state_version_history WHERE operator_id = 0 AND partition_id = 0"
        " ORDER BY version, kind",
    )
    assert [(r.version, r.kind) for r in history][:6] == [
        (1, "delta"),
        (2, "delta"),
        (3, "delta"),
        (4, "delta"),
        (5, "delta"),
        (5, "snapshot"),
    ]
    assert {r.query_id for r in history} == {"a"} and history[0].batch_id == 0
    entries = catalog.version_history(ROOT, stores=[A], limit=100)
    assert {(e.ref.version, f.path) for e in entries for f in e.files} == {
        (r.version, r.path) for r in history
    }

    lineage = rows(
        catalog,
        "SELECT * FROM state_lineage WHERE operator_id = 0 AND partition_id = 0 AND version = 12"
        " ORDER BY file_version",
    )
    (retained,) = [r for r in catalog.retained_versions(ROOT, A) if r.ref.version == 12]
    assert [r.path for r in lineage] == [f.path for f in retained.files]
    assert lineage[0].kind == "snapshot" and lineage[0].base_version == 10

    run = catalog.start_run("cleanup", "tests")
    claimed = catalog.claim_deletions(run, RetentionPolicy(), ROOT, [A])
    assert claimed
    catalog.record_deletions(run, ROOT, [v.file.path for v in claimed])
    deletions = rows(catalog, "SELECT * FROM state_deletions ORDER BY path")
    assert sorted(r.path for r in deletions) == sorted(v.file.path for v in claimed)
    assert {r.run_id for r in deletions} == {run} and deletions[0].reason
    gone = rows(
        catalog,
        "SELECT DISTINCT version FROM state_lineage WHERE operator_id = 0 AND partition_id = 0"
        " AND state = 'deleted'",
    )
    assert gone  # old versions show that their files are gone
    assert C  # the broken store is in the fleet too


def test_history_of_some_stores_counts_only_theirs_against_the_limit(catalog: Catalog) -> None:
    """Stores 0/0 and 1/1 asked for: 0/1 and 1/0 (same operator and partition ids) never take
    a place of the limit."""
    everyone = [StoreId(o, p) for o in (0, 1) for p in (0, 1)]
    Stream(catalog, everyone).run(3)
    wanted = [StoreId(0, 0), StoreId(1, 1)]
    entries = catalog.version_history(ROOT, stores=wanted, limit=4)
    assert len(entries) == 4 and {e.key.store for e in entries} == set(wanted)
    assert sorted(e.ref.version for e in entries) == [2, 2, 3, 3]
    assert catalog.version_history(ROOT, stores=[], limit=4) == []
