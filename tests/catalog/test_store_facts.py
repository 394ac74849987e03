"""The store facts and status the views render are what ``store_health`` and the Python rule
give, on generated catalogs (cleaned, held, orphaned, snapshotted) and random policies: on
SQLite the default views, on PostgreSQL also the functions of the policy and the limits."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime.catalog import Catalog, RetentionPolicy, StoreHealth
from state_runtime.identity import StoreId
from state_runtime.settings import MAINTENANCE
from state_runtime.status import DEFAULT_LIMITS, store_status
from tests.catalog.test_views import build_store, store_facts, when

FIGURES = (
    "versions_behind",
    "last_snapshot_version",
    "deltas_since_snapshot",
    "versions_loadable",
    "state_rows",
    "live_files",
    "live_bytes",
    "orphan_files",
    "orphan_bytes",
    "reclaimable_files",
    "reclaimable_bytes",
    "open_problems",
    "first_problem",
)
TIMES = (
    "created_at",
    "last_committed_at",
    "last_snapshot_at",
    "chain_since",
    "oldest_orphan_at",
    "problems_since",
    "last_resolved_at",
    "last_restored_at",
    "first_validated_at",
    "last_validated_at",
)
HOUR = timedelta(hours=1)
policies = st.builds(
    RetentionPolicy,
    retain_versions=st.integers(2, 4),
    window=st.sampled_from([timedelta(0), HOUR]),
    orphan_grace=st.sampled_from([timedelta(0), HOUR]),
)
cleanups = st.sampled_from(["none", "claimed", "deleted"])


def clean(catalog: Catalog, root: str, store: StoreId, how: str) -> None:
    """Cleanup with no window claims what it may (and, ``deleted``, records it gone)."""
    if how == "none":
        return
    run = catalog.start_run("cleanup", "tests")
    claimed = catalog.claim_deletions(run, RetentionPolicy(window=timedelta(0)), root, [store])
    if how == "deleted":
        catalog.record_deletions(run, root, [v.file.path for v in claimed])
    catalog.finish_run(run, "succeeded")


def python_row(h: StoreHealth, lag: int, orphans: int) -> tuple[object, ...]:
    status = store_status(h, lag_warn_deltas=lag, orphan_warn_files=orphans)
    return (
        h.latest.version,
        *(getattr(h, name) for name in FIGURES),
        *(getattr(h, name) for name in TIMES),
        status.status.value,
        status.reason,
        status.since,
    )


def sql_row(r: Any) -> tuple[object, ...]:
    return (
        r["latest_version"],
        *(r[name] for name in FIGURES),
        *(when(r[name]) for name in TIMES),
        r["status"],
        r["status_reason"],
        when(r["status_since"]),
    )


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fleet=st.lists(st.tuples(store_facts, cleanups), min_size=1, max_size=3),
    policy=policies,
    lag=st.integers(1, 25),
    orphans=st.integers(1, 4),
)
def test_the_rendered_facts_and_status_are_store_health_and_the_python_rule(
    catalog: Catalog,
    fleet: list[tuple[dict[str, Any], str]],
    policy: RetentionPolicy,
    lag: int,
    orphans: int,
) -> None:
    root = f"/facts/{uuid.uuid4().hex}"
    for i, (facts, how) in enumerate(fleet):
        build_store(catalog, root, StoreId(i, 0), facts)
        clean(catalog, root, StoreId(i, 0), how)

    def python(policy: RetentionPolicy, lag: int, orphans: int) -> dict[int, tuple[object, ...]]:
        health = catalog.store_health(policy, root=root)
        return {h.key.store.operator_id: python_row(h, lag, orphans) for h in health}

    def sql(query: str, **parameters: object) -> dict[int, tuple[object, ...]]:
        with catalog.engine.connect() as connection:
            rows = connection.execute(sa.text(query), {**parameters, "root": root}).mappings()
            return {r["operator_id"]: sql_row(r) for r in rows}

    defaults = (RetentionPolicy(), *DEFAULT_LIMITS.values())
    view = sql("SELECT * FROM state_store_health WHERE checkpoint_root = :root")
    assert view == python(*defaults)
    if catalog.dialect == "postgresql":
        function = sql(
            "SELECT * FROM state_store_health_at(:retain, :window, :grace, :lag, :orphans)"
            " WHERE checkpoint_root = :root",
            retain=policy.retain_versions,
            window=policy.window,
            grace=policy.orphan_grace,
            lag=lag,
            orphans=orphans,
        )
        assert function == python(policy, lag, orphans)


def test_the_policy_defaults_view_is_the_settings(catalog: Catalog) -> None:
    """``state_policy_defaults`` (what the psql scripts fall back on) holds each maintenance
    setting's declared default: PostgreSQL as intervals, SQLite as Python's duration text."""
    with catalog.engine.connect() as connection:
        row = connection.execute(sa.text("SELECT * FROM state_policy_defaults")).mappings().one()
    declared = {s.name: s.default for s in MAINTENANCE if s.default is not None}
    if catalog.dialect == "sqlite":
        declared = {k: str(v) if isinstance(v, timedelta) else v for k, v in declared.items()}
    assert dict(row) == declared
    assert row["retain_versions"] == RetentionPolicy().retain_versions
