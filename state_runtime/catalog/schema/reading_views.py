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
    state_schemas,
    store_problems,
    stores,
)

PREFIX: Final = "read_"
REVISION_VIEW: Final = "read_schema_revision"
"""The schema's revision (Alembic's ``alembic_version``), for the check every process makes."""
READABLE: Final = (
    stores,
    checkpoint_files,
    commit_log,
    deletion_ledger,
    maintenance_runs,
    store_problems,
    file_repairs,
    batch_metrics,
    batch_watermarks,
    state_schemas,
    operator_schemas,
    operator_layouts,
    batch_intents,
)
"""The tables with a reading view, in creation order."""


def view_of(table: sa.Table) -> sa.TableClause:
    """The reading view of ``table``: the same columns and types, under the view's name."""
    return sa.table(PREFIX + table.name, *(sa.column(c.name, c.type) for c in table.c))


read_stores = view_of(stores)
read_files = view_of(checkpoint_files)
read_commits = view_of(commit_log)
read_deletions = view_of(deletion_ledger)
read_runs = view_of(maintenance_runs)
read_problems = view_of(store_problems)
read_repairs = view_of(file_repairs)
read_batch_metrics = view_of(batch_metrics)
read_watermarks = view_of(batch_watermarks)
read_state_schemas = view_of(state_schemas)
read_operator_schemas = view_of(operator_schemas)
read_operator_layouts = view_of(operator_layouts)
read_batch_intents = view_of(batch_intents)
