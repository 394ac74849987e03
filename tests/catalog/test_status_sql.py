"""The operators' SQL tells the same truth as the library: store status (healthy, degraded,
broken, unknown, with reason and since), and the retention verdicts for damaged, unverified
and held files, on real PostgreSQL with psql."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, FoundProblem, RetentionPolicy, StoreKey, Verdict
from state_runtime.identity import StoreId
from state_runtime.maintenance import MaintenancePolicy, StoreStatus, store_status
from tests.catalog.factory import ROOT, Stream, info
from tests.catalog.test_sql_queries import run_psql

pytestmark = pytest.mark.postgres

A, B, C = StoreId(0, 0), StoreId(0, 1), StoreId(1, 0, "dedup")
D, E, F = StoreId(2, 0), StoreId(3, 0), StoreId(4, 0)
G = StoreId(5, 0)


@dataclass
class Fleet:
    catalog: Catalog
    expected: dict[StoreId, StoreStatus]
    damaged: str
    unverified: str


def validate(catalog: Catalog, store: StoreId, *found: FoundProblem) -> None:
    run = catalog.start_run("validate", "tests")
    catalog.record_validation(run, StoreKey(ROOT, store), {}, list(found))
    catalog.finish_run(run, "succeeded")


@pytest.fixture
def fleet(pg_catalog: Catalog) -> Fleet:
    return build_fleet(pg_catalog)


def build_fleet(catalog: Catalog) -> Fleet:
    """A healthy, unknown, broken and two degraded stores, and one healed: every status."""
    a = Stream(catalog, [A], query="a")
    for version in range(1, 13):
        a.commit()
        if version in (5, 10):
            a.snapshot(A)
    validate(catalog, A)

    b = Stream(catalog, [B], query="b")
    b.run(12)
    unverified = b.snapshot(B, verified=False).path  # written, never verified

    c = Stream(catalog, [C], query="c")
    c.run(4)
    c.snapshot(C)
    c.run(4)
    damaged = info(
        C,
        8,
        c.committed[C][6].checkpoint_id,
        kind=c.committed[C][7].kind.SNAPSHOT,
        lineage=c.committed[C][7].lineage,
        checkpoint_id=c.committed[C][7].checkpoint_id,
    )
    catalog.record_snapshot(ROOT, damaged, problem="corrupt checkpoint file: checksum mismatch")
    c.run(4)
    validate(
        catalog,
        C,
        FoundProblem("corrupt checkpoint file: checksum mismatch", damaged.path, 8),
        FoundProblem("commit log is not linear: retained versions [12], expected [12, 11]"),
    )

    Stream(catalog, [D], query="d").run(25)
    validate(catalog, D)

    e = Stream(catalog, [E], query="e")
    e.run(3)
    for version in (2, 3):  # two attempts that lost: orphans
        lost = info(E, version, e.committed[E][version - 2].checkpoint_id, created_at=e.clock)
        catalog.record_files(ROOT, [lost])
    validate(catalog, E)

    Stream(catalog, [F], query="f").run(3)
    validate(catalog, F, FoundProblem("file is missing from storage", "state/4/0/default/x", 2))
    validate(catalog, F)
    g = Stream(catalog, [G], query="g")
    g.run(4)
    validate(catalog, G, FoundProblem("file is missing from storage", g.committed[G][3].path, 4))
    restore = catalog.start_run("restore", "tests")  # back to batch 2 (version 3): resolved
    catalog.rewind_query(ROOT, "g", 2, {G: g.committed[G][2].ref}, reason="r", run_id=restore)
    catalog.finish_run(restore, "succeeded")
    expected = {
        A: StoreStatus.HEALTHY,
        B: StoreStatus.UNKNOWN,
        C: StoreStatus.BROKEN,
        D: StoreStatus.DEGRADED,
        E: StoreStatus.HEALTHY,
        F: StoreStatus.HEALTHY,
        G: StoreStatus.UNKNOWN,
    }
    return Fleet(catalog, expected, damaged.path, unverified)


def python_status(catalog: Catalog, lag: int, orphans: int) -> dict[StoreId, tuple[object, ...]]:
    return {
        h.key.store: (s.status.value, s.reason, s.since)
        for h in catalog.store_health(RetentionPolicy())
        for s in [store_status(h, lag_warn_deltas=lag, orphan_warn_files=orphans)]
    }


def sql_status(catalog: Catalog, lag: int, orphans: int) -> dict[StoreId, tuple[object, ...]]:
    with catalog.engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT s.operator_id, s.partition_id, s.store_name, st.status,"
                " st.status_reason, st.status_since"
                " FROM state_store_status(:lag, :orphans) st JOIN stores s USING (store_id)"
            ),
            {"lag": lag, "orphans": orphans},
        ).all()
    return {StoreId(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in rows}


def test_every_status_agrees_with_the_python_rule(fleet: Fleet) -> None:
    catalog = fleet.catalog
    for lag, orphans in ((20, 100), (5, 2), (30, 1)):
        assert sql_status(catalog, lag, orphans) == python_status(catalog, lag, orphans)
    found = python_status(catalog, 20, 100)
    assert {store: StoreStatus(row[0]) for store, row in found.items()} == fleet.expected
    assert found[C][1] == (
        f"2 open problems; first: corrupt checkpoint file: checksum mismatch (file {fleet.damaged})"
    )
    assert found[D][1] == "25 deltas since the last verified snapshot (warn at 20)"
    assert found[B][1] == "never validated"
    strict = python_status(catalog, 5, 2)
    assert strict[E][:2] == ("degraded", "2 orphan files (warn at 2)")
    assert strict[A][0] == "healthy"  # 2 deltas since the snapshot at 10


def test_since_is_when_the_status_changed_and_a_restore_is_not_a_validation(
    fleet: Fleet,
) -> None:
    """Degraded since its validation, not since its chain began (it was unknown before); a
    restore that resolved a store's problem leaves it unknown since the restore, until a
    validation finds it sound: healthy since that validation's run closed (the recorded
    change), not since the restore; SQL agrees at each step."""
    catalog = fleet.catalog
    facts = {h.key.store: h for h in catalog.store_health(RetentionPolicy())}
    found = python_status(catalog, 20, 100)
    assert found[D][2] == facts[D].first_validated_at > (facts[D].chain_since or found[D][2])
    assert found[G] == ("unknown", "restored; not validated since", facts[G].last_restored_at)
    assert facts[G].last_restored_at == facts[G].last_resolved_at
    validate(catalog, G)
    found = python_status(catalog, 20, 100)
    after = {h.key.store: h for h in catalog.store_health(RetentionPolicy())}
    assert found[G] == ("healthy", "validated, no open problems", after[G].status_changed_at)
    assert after[G].status_changed_at is not None and after[G].last_validated_at is not None
    assert after[G].status_changed_at >= after[G].last_validated_at > facts[G].last_restored_at
    assert sql_status(catalog, 20, 100) == found


def test_store_health_sql_shows_the_status(fleet: Fleet) -> None:
    defaults = MaintenancePolicy()
    python = python_status(fleet.catalog, defaults.lag_warn_deltas, defaults.orphan_warn_files)
    rows = run_psql(fleet.catalog, "store_health.sql")
    shown = {
        StoreId(int(r["operator_id"]), int(r["partition_id"]), r["store_name"]): (
            r["status"],
            r["status_reason"],
        )
        for r in rows
    }
    assert shown == {store: row[:2] for store, row in python.items()}
    strict = run_psql(fleet.catalog, "store_health.sql", lag_warn=5, orphan_warn=2)
    assert {
        r["status"] for r in strict if r["partition_id"] == "0" and r["operator_id"] == "3"
    } == {"degraded"}
    with fleet.catalog.engine.connect() as connection:
        view = dict(
            connection.execute(
                sa.text(
                    "SELECT store_name || operator_id || partition_id, status"
                    " FROM state_store_health"
                )
            ).all()
        )
    assert sorted(view.values()) == sorted(row[0] for row in python.values())


def test_damaged_unverified_and_held_verdicts_agree_with_python(fleet: Fleet) -> None:
    catalog = fleet.catalog
    for retain, window in ((2, timedelta(hours=1)), (3, timedelta(0))):
        policy = RetentionPolicy(retain_versions=retain, window=window, orphan_grace=timedelta(0))
        with catalog.engine.connect() as connection:
            sql = {
                row.path: (row.verdict, row.reason)
                for row in connection.execute(
                    sa.text(
                        "SELECT path, verdict, reason"
                        " FROM state_file_verdicts(:r, :w, interval '0')"
                    ),
                    {"r": retain, "w": window},
                )
            }
        python = {v.file.path: v for v in catalog.file_verdicts(policy)}
        assert {path: verdict for path, (verdict, _) in sql.items()} == {
            path: v.verdict.value for path, v in python.items()
        }
        for path, v in python.items():
            if v.verdict in (Verdict.DAMAGED, Verdict.UNVERIFIED, Verdict.HELD):
                assert sql[path][1] == v.reason
    verdicts = {v.file.path: v.verdict for v in catalog.file_verdicts(RetentionPolicy())}
    assert verdicts[fleet.damaged] is Verdict.DAMAGED
    assert verdicts[fleet.unverified] is Verdict.UNVERIFIED
    assert Verdict.HELD in {v for p, v in verdicts.items() if p.startswith("state/1/0/dedup/")}
    preview = run_psql(catalog, "cleanup_preview.sql", retention="0 seconds")
    assert not {r["path"] for r in preview} & {
        p for p in verdicts if p.startswith("state/1/0/dedup/") or p.startswith("state/0/1/")
    }
    (explained,) = run_psql(catalog, "explain_file.sql", root=ROOT, path=fleet.damaged)
    assert explained["verdict"] == "damaged" and "checksum mismatch" in explained["reason"]
