"""Roots relative to a SQLite catalog's folder (this revision once also created the operators'
views on SQLite; views are now rendered from the rules by
``state_runtime/catalog/schema/operator_views.py`` and recreated after every upgrade, on both
dialects).

Roots: a SQLite catalog file stores the local roots inside its folder relative to it
(``./checkpoint``; see ``state_runtime/catalog/sql/roots.py``), so the folder can be moved or
copied whole. This revision converts the existing rows.

Revision ID: 0007_views_everywhere
Revises: 0006_verified_snapshots
Create Date: 2026-11-23
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from state_runtime.catalog.sql.roots import resolved_root, stored_root

revision = "0007_views_everywhere"
down_revision: str | None = "0006_verified_snapshots"
branch_labels: str | None = None
depends_on: str | None = None


def _catalog_folder() -> Path | None:
    """The folder of a SQLite catalog file being migrated (None: not a file)."""
    url = op.get_bind().engine.url
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in {"", ":memory:"}:
        return None
    return None if database.startswith("file:") else Path(database).absolute().parent


def _convert_roots(convert: object) -> None:
    """Rewrite every stored root with ``convert(root, folder)``."""
    folder = _catalog_folder()
    if folder is None:
        return
    bind = op.get_bind()
    for table in ("stores", "batch_metrics"):
        roots = bind.exec_driver_sql(f"SELECT DISTINCT checkpoint_root FROM {table}").scalars()
        for old in list(roots):
            new = convert(old, folder)  # type: ignore[operator]
            if new != old:
                bind.exec_driver_sql(
                    f"UPDATE {table} SET checkpoint_root = ? WHERE checkpoint_root = ?",
                    (new, old),
                )


def upgrade() -> None:
    _convert_roots(stored_root)


def downgrade() -> None:
    _convert_roots(resolved_root)
