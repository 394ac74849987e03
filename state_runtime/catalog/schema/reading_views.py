"""The reading views: what every read of the catalog selects from, so a reader needs no table.

Each table a read needs has a view ``read_<table>`` of exactly its columns (rendered by
:mod:`state_runtime.catalog.schema.operator_views`, recreated by every upgrade). The read queries
(health, history, explanations, the retention verdicts, metrics, schema histories, the schema's
revision) select from these views, so the reader role is granted SELECT on the views alone
(:mod:`state_runtime.catalog.schema.grants`): on PostgreSQL a view reads its tables with its
owner's rights. A plain projection is inlined by both planners: the same plans as the table.

The leases (their tokens) and the store holders (workers' names) have no reading view: no
read command needs them, so the reader never sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from state_runtime.catalog.schema.tables import (
    batch_intents,
    batch_metrics,
    batch_watermarks,
    checkpoint_files,
    commit_log,
    deletion_ledger,
    file_repairs,
    maintenance_runs,
    operator_layouts,
    operator_schemas,
    root_queries,
    state_schemas,
    store_problems,
    store_status_changes,
    stores,
)

PREFIX: Final = "read_"
REVISION_VIEW: Final = "read_schema_revision"
"""The schema's revision (Alembic's ``alembic_version``), for the check every process makes."""
VIEWED: Final = {
    "stores": stores,
    "files": checkpoint_files,
    "commits": commit_log,
    "deletions": deletion_ledger,
    "runs": maintenance_runs,
    "problems": store_problems,
    "repairs": file_repairs,
    "batch_metrics": batch_metrics,
    "watermarks": batch_watermarks,
    "state_schemas": state_schemas,
    "operator_schemas": operator_schemas,
    "operator_layouts": operator_layouts,
    "batch_intents": batch_intents,
    "status_changes": store_status_changes,
    "root_queries": root_queries,
}
"""Each table with a reading view, by its name in :class:`ReaderViews`, in creation order."""
READABLE: Final = tuple(VIEWED.values())
"""The tables with a reading view, in creation order."""


def view_of(table: sa.Table) -> sa.TableClause:
    """The reading view of ``table``: the same columns and types, under the view's name."""
    return sa.table(PREFIX + table.name, *(sa.column(c.name, c.type) for c in table.c))


@dataclass(frozen=True)
class ReaderViews:
    """The reading views, and nothing else: what a read function receives and selects from.

    A read function takes this namespace as a parameter, so the relations it reaches are
    those it was handed; tests/catalog/test_reader_namespace.py fails if such a function
    names a table. A read of ``Catalog`` gets :data:`READER_VIEWS` from ``CatalogBase._read``;
    a write that runs a read function inside its transaction hands it :data:`WRITE_LOOKUPS`
    (the same views).
    """

    stores: sa.TableClause
    files: sa.TableClause
    commits: sa.TableClause
    deletions: sa.TableClause
    runs: sa.TableClause
    problems: sa.TableClause
    repairs: sa.TableClause
    batch_metrics: sa.TableClause
    watermarks: sa.TableClause
    state_schemas: sa.TableClause
    operator_schemas: sa.TableClause
    operator_layouts: sa.TableClause
    batch_intents: sa.TableClause
    status_changes: sa.TableClause
    root_queries: sa.TableClause


READER_VIEWS: Final = ReaderViews(**{name: view_of(t) for name, t in VIEWED.items()})
"""The one namespace of reading views. Only the read path's entry (``CatalogBase._read``) and
the operators' views (rendered from the read queries) import it."""
WRITE_LOOKUPS: Final = READER_VIEWS
"""What a write hands the read functions it calls inside its transaction (the store ids, the
latest entry, the verdicts it claims by): the same reading views, so that a role lacking a
write's right is refused at the write, naming that right, never at a lookup before it. No
read function may name it (tests/catalog/test_reader_namespace.py): a read gets its views
only as a parameter."""
