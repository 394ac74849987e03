"""Catalog questions its API does not ask: claimed stores, known paths, a previous run.

Plain reads of the catalog tables, one transaction each, no storage request.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog, FileState, RunKind, RunOutcome, StoreKey
from state_runtime.catalog.engine import run_transaction
from state_runtime.catalog.tables import checkpoint_files, maintenance_runs, stores
from state_runtime.identity import StoreId


def claimed_stores(catalog: Catalog, root: str | None) -> set[StoreKey]:
    """Stores with files claimed for deletion but not yet recorded deleted (a run stopped
    between claim and record); cleanup resumes them."""

    def work(connection: Connection) -> set[StoreKey]:
        s, f = stores.c, checkpoint_files.c
        query = (
            sa.select(s.checkpoint_root, s.operator_id, s.partition_id, s.store_name)
            .distinct()
            .join(checkpoint_files, f.store_id == s.store_id)
            .where(f.state == FileState.DELETING.value)
        )
        if root is not None:
            query = query.where(s.checkpoint_root == root)
        return {
            StoreKey(r.checkpoint_root, StoreId(r.operator_id, r.partition_id, r.store_name))
            for r in connection.execute(query)
        }

    return run_transaction(catalog.engine, work, retry=catalog.retry, what="find claimed stores")


def known_paths(catalog: Catalog, root: str) -> dict[str, str]:
    """Every path the catalog has a record of below ``root``, with its state."""

    def work(connection: Connection) -> dict[str, str]:
        s, f = stores.c, checkpoint_files.c
        rows = connection.execute(
            sa.select(f.path, f.state)
            .join(stores, s.store_id == f.store_id)
            .where(s.checkpoint_root == root)
        )
        return {r.path: r.state for r in rows}

    return run_transaction(catalog.engine, work, retry=catalog.retry, what="read known paths")


def previous_run_counts(
    catalog: Catalog, kind: RunKind, scope: str, before_run_id: int
) -> dict[str, Any] | None:
    """The counts of the newest succeeded run of ``kind`` over the same ``scope`` (its
    ``parameters["scope"]``) that started before run ``before_run_id``."""

    def work(connection: Connection) -> dict[str, Any] | None:
        r = maintenance_runs.c
        rows = connection.execute(
            sa.select(r.parameters, r.counts)
            .where(
                r.kind == kind.value,
                r.outcome == RunOutcome.SUCCEEDED.value,
                r.run_id < before_run_id,
            )
            .order_by(r.run_id.desc())
            .limit(50)
        )
        for row in rows:
            if (row.parameters or {}).get("scope") == scope:
                return dict(row.counts)
        return None

    return run_transaction(catalog.engine, work, retry=catalog.retry, what="read previous run")
