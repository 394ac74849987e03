"""A root's statements on PostgreSQL read the root's store ids once and search the commit
log and the files by them: ``store_id = ANY(ARRAY(<the root's ids>))``
(:class:`~state_runtime.catalog.sql.scope.AmongFound`), never ``IN (<the root's ids>)``,
which the planner joined in: at 20,000 stores a hash join of the whole commit log and files
for a root's 200 (docs/maintenance.md, *Plans at fleet size*)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.reading_views import READER_VIEWS
from state_runtime.catalog.sql import health
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage
from tests.maintenance.conftest import STORES
from tests.maintenance.streams import StoreStream

SCOPED_BY_ARRAY = "store_id = ANY(ARRAY(SELECT read_stores.store_id"
"""How a root's scope reads in PostgreSQL's SQL (``IN (SELECT ...)`` before)."""


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _root_reads(catalog: Catalog, statement: sa.Select[Any], values: dict[str, Any]) -> list[str]:
    """How each read of the stores by root (a scan of ``stores`` conditioned on
    ``checkpoint_root``) feeds ``statement``'s plan: ``InitPlan`` (the root's ids read once,
    an array the other scans search by), ``ANY`` (a search by such an array: the roots of
    the stores in scope), or what joined it to whole tables (``Inner``, ``SubPlan``)."""
    with catalog.engine.connect() as connection:
        state = statement.compile(dialect=connection.dialect).construct_expanded_state(values)
        plan = connection.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) " + state.statement, state.parameters
        ).scalar_one()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    reads = []
    for node in _nodes(top):
        conditions = " ".join(node.get(p, "") for p in ("Index Cond", "Recheck Cond", "Filter"))
        if node.get("Relation Name") == "stores" and "checkpoint_root" in conditions:
            by_array = "checkpoint_root = ANY" in conditions
            reads.append("ANY" if by_array else node.get("Parent Relationship", ""))
    return reads


def test_a_roots_health_reads_by_its_store_ids(pg_catalog: Catalog, tmp_path: Path) -> None:
    """Three roots of a few batches each: the health and recovery-cost statements of one
    root read its store ids only as InitPlans (``ANY(ARRAY(...))``), and the stores of its
    root by that array (each root's newest version); as ``IN (...)`` they were joined in (a
    semi join, a hashed subplan), what at fleet size hash-joined the whole commit log and
    files to them."""
    streams = [
        StoreStream(pg_catalog, LocalStorage(tmp_path / name), list(STORES))
        for name in ("a", "b", "c")
    ]
    for stream in streams:
        stream.run(3)
    with pg_catalog.engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE")
    now, policy = datetime.now(UTC), RetentionPolicy()
    root = {"root": streams[1].root}
    cutoffs = {
        "committed_cutoff": policy.committed_cutoff(now),
        "uncommitted_cutoff": policy.uncommitted_cutoff(now),
    }
    views = READER_VIEWS
    shape = ("postgresql", True, False)
    recovery = health._recovery_query(views, *shape)
    statement = health._store_health_query(views, "postgresql", policy.retain_versions, True, False)
    for query in (recovery, statement):  # the root's ids as an array, not a set to join in
        assert SCOPED_BY_ARRAY in str(query.compile(dialect=pg_catalog.engine.dialect))
    # The plans: wherever the stores are read by root, as an InitPlan or by that array (a CI
    # run's plan read them in no way this finds: the planner's choice on a few rows, not a join).
    reads = _root_reads(pg_catalog, recovery, root)
    assert set(reads) <= {"InitPlan"}, reads
    reads = _root_reads(pg_catalog, statement, root | cutoffs)
    assert set(reads) <= {"InitPlan", "ANY"}, reads
