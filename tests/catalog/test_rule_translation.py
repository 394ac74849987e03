"""The catalog's SQL is a faithful translation of the retention rule: on random store histories
(snapshots verified, unverified or damaged, orphans, attempts in flight, claims, held stores,
writers' clocks behind the database's, any policy and clock), ``Catalog.file_verdicts``
gives every file the verdict, reason and needing versions that
``state_runtime.retention.judge_store`` gives it in Python; and so do
the operators' views rendered from the rule (``state_cleanup_preview`` on both dialects at the
default policy, ``state_file_verdicts`` on PostgreSQL under any policy), read at the
database's own clock."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime.catalog import Catalog, FoundProblem, RetentionPolicy, StoreKey
from state_runtime.identity import StoreId
from state_runtime.retention import FileState, judge_store
from tests.catalog.factory import LONG_AGO, Stream, info

STORE = StoreId(0, 0)


@st.composite
def histories(draw: st.DrawFn) -> dict[str, object]:
    versions = draw(st.integers(1, 12))
    return {
        "versions": versions,
        "snapshots": draw(
            st.dictionaries(
                st.integers(1, versions),
                st.sampled_from(["verified", "unverified", "failed"]),
                max_size=4,
            )
        ),
        "orphans": draw(st.lists(st.integers(1, versions), max_size=2)),
        "in_flight": draw(st.booleans()),
        "claimed": draw(st.booleans()),
        "held": draw(st.booleans()),
        "retain": draw(st.integers(2, 4)),
        "window": draw(st.sampled_from([0, 5, 60])),
        "grace": draw(st.sampled_from([0, 30, 600])),
        "now": draw(st.integers(0, 40)),
        "behind": draw(st.sampled_from([0, 3, 30])),  # the writers' clocks, in minutes
    }


def build(catalog: Catalog, h: dict[str, object], start: datetime = LONG_AGO) -> str:
    """The history's catalog records start at ``start``; its writers stamp their files
    ``behind`` minutes earlier."""
    name = uuid.uuid4().hex
    root = f"/rule/{name}"
    behind = timedelta(minutes=int(h["behind"]))  # type: ignore[call-overload]
    stream = Stream(
        catalog, [STORE], root=root, query=name, clock=start - behind, writers_behind=behind
    )
    snapshots: dict[int, str] = h["snapshots"]  # type: ignore[assignment]
    for version in range(1, int(h["versions"]) + 1):  # type: ignore[call-overload]
        stream.commit()
        state = snapshots.get(version)
        if state is not None:
            snap = stream.snapshot(STORE, verified=state == "verified")
            if state == "failed":
                catalog.record_verifications(root, {snap.path: "checksum differs"})
    for version in h["orphans"]:  # type: ignore[attr-defined]
        base = stream.committed[STORE][version - 2].checkpoint_id if version > 1 else None
        stream.record([info(STORE, version, base, created_at=stream.clock)])
    if h["in_flight"]:
        stream.record([stream.delta(STORE)])
    if h["claimed"]:
        run = catalog.start_run("cleanup", "tests")
        catalog.claim_deletions(
            run, RetentionPolicy(window=timedelta(0)), root, limit=1, now=stream.clock
        )
    if h["held"]:
        catalog.add_problems(StoreKey(root, STORE), [FoundProblem("file is missing")])
    return root


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(h=histories())
def test_sql_verdicts_are_the_python_rule(catalog: Catalog, h: dict[str, object]) -> None:
    root = build(catalog, h)
    policy = RetentionPolicy(
        retain_versions=int(h["retain"]),  # type: ignore[call-overload]
        window=timedelta(minutes=int(h["window"])),  # type: ignore[call-overload]
        orphan_grace=timedelta(minutes=int(h["grace"])),  # type: ignore[call-overload]
    )
    now = LONG_AGO + timedelta(minutes=int(h["now"]))  # type: ignore[call-overload]
    sql = {v.file.path: v for v in catalog.file_verdicts(policy, root=root, now=now)}
    files = [
        r.facts()
        for r in catalog.store_files(root, STORE)
        + [v.file for v in sql.values() if v.file.state == FileState.DELETING]
    ]
    (record,) = catalog.stores(root)
    held = bool(catalog.problems(root=root))
    python = {
        j.file.path: j
        for j in judge_store(
            files,
            record.latest.version,
            policy,
            now,
            held=held,
            expired_through=record.expired_through,
        )
    }
    assert set(sql) == set(python)
    for path, verdict in sql.items():
        judged = python[path]
        assert (verdict.verdict, verdict.needed_by) == (judged.verdict, judged.needed_by), path
        if verdict.verdict.value != "deleting":  # a claim keeps the reason it was claimed for
            assert verdict.reason == judged.reason, path


def python_verdicts(
    catalog: Catalog, root: str, policy: RetentionPolicy, now: datetime
) -> dict[str, tuple[str, int | None, int | None, str]]:
    """Each live or claimed file of ``root``'s store: verdict, needing versions and reason, as
    ``judge_store`` says (a claimed file keeps the reason it was claimed for)."""
    catalog_verdicts = {v.file.path: v for v in catalog.file_verdicts(policy, root=root, now=now)}
    claimed = [v.file for v in catalog_verdicts.values() if v.file.state == FileState.DELETING]
    files = [r.facts() for r in catalog.store_files(root, STORE) + claimed]
    (record,) = catalog.stores(root)
    held = bool(catalog.problems(root=root))
    judged = judge_store(
        files, record.latest.version, policy, now, held=held, expired_through=record.expired_through
    )
    return {
        j.file.path: (
            j.verdict.value,
            *(j.needed_by or (None, None)),
            # judge_store does not know the claiming run; the catalog's reason names it
            catalog_verdicts[j.file.path].reason if j.verdict.value == "deleting" else j.reason,
        )
        for j in judged
    }


def view_verdicts(
    catalog: Catalog, root: str, sql: str, parameters: dict[str, Any]
) -> tuple[datetime, dict[str, tuple[str, int | None, int | None, str]]]:
    """The database's clock and each file of ``root`` as the view or function gives it."""
    clock = "now()" if catalog.dialect == "postgresql" else "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    with catalog.engine.connect() as connection:
        rows = connection.execute(
            sa.text(f"SELECT {clock} AS clock, v.* FROM ({sql}) v WHERE checkpoint_root = :root"),
            {**parameters, "root": root},
        ).all()
        now = connection.execute(sa.text(f"SELECT {clock}")).scalar_one()
    now = rows[0].clock if rows else now
    now = now if isinstance(now, datetime) else datetime.fromisoformat(now).replace(tzinfo=UTC)
    found = {r.path: (r.verdict, r.needed_from, r.needed_to, r.reason) for r in rows}
    return now, found


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(h=histories(), ago=st.sampled_from([0, 50, 58, 70, 600]))
def test_the_rendered_views_give_the_python_verdicts(
    catalog: Catalog, h: dict[str, object], ago: int
) -> None:
    """The history ends ``ago`` minutes before the database's clock; the default policy keeps
    files for an hour, so the views' time facts fall on both sides."""
    root = build(catalog, h, datetime.now(UTC) - timedelta(minutes=ago + 12))
    now, view = view_verdicts(catalog, root, "SELECT * FROM state_cleanup_preview", {})
    assert view == python_verdicts(catalog, root, RetentionPolicy(), now)
    if catalog.dialect != "postgresql":
        return
    policy = RetentionPolicy(
        retain_versions=int(h["retain"]),  # type: ignore[call-overload]
        window=timedelta(minutes=int(h["window"])),  # type: ignore[call-overload]
        orphan_grace=timedelta(minutes=int(h["grace"])),  # type: ignore[call-overload]
    )
    now, function = view_verdicts(
        catalog,
        root,
        "SELECT * FROM state_file_verdicts(:retain, :window, :grace)",
        {"retain": policy.retain_versions, "window": policy.window, "grace": policy.orphan_grace},
    )
    assert function == python_verdicts(catalog, root, policy, now)
