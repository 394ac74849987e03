"""Estimated recovery cost: the files and bytes a cold load of each store's latest version reads.

One query over the catalog's inventory for a whole root (the catalog's own "files needed by
the retained versions" walk, for the newest version only); no storage request.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog, StoreKey
from state_runtime.catalog.engine import run_transaction
from state_runtime.catalog.retention import Scope, needed_files
from state_runtime.catalog.tables import checkpoint_files, stores
from state_runtime.identity import StoreId


@dataclass(frozen=True)
class RecoveryCost:
    files: int
    bytes: int


def recovery_costs(catalog: Catalog, root: str | None = None) -> dict[StoreKey, RecoveryCost]:
    """Per store (of ``root``, or all), what loading its latest committed version reads."""

    def work(connection: Connection) -> dict[StoreKey, RecoveryCost]:
        nf = needed_files(1, Scope(root=root)).subquery("nf")
        s, f = stores.c, checkpoint_files.c
        query = (
            sa.select(
                s.checkpoint_root,
                s.operator_id,
                s.partition_id,
                s.store_name,
                sa.func.count().label("files"),
                sa.func.sum(f.size_bytes).label("bytes"),
            )
            .select_from(nf)
            .join(checkpoint_files, f.file_id == nf.c.file_id)
            .join(stores, s.store_id == nf.c.store_id)
            .group_by(s.checkpoint_root, s.operator_id, s.partition_id, s.store_name)
        )
        return {
            StoreKey(
                r.checkpoint_root, StoreId(r.operator_id, r.partition_id, r.store_name)
            ): RecoveryCost(int(r.files), int(r.bytes))
            for r in connection.execute(query)
        }

    return run_transaction(
        catalog.engine, work, retry=catalog.retry, what="estimate recovery costs"
    )
