"""Loosening a table's definition in a migration (a wider CHECK, a column that may be NULL),
on both dialects."""

from __future__ import annotations

from alembic import op


def swap_runs_check(name: str, before: str, after: str) -> None:
    """Replace ``maintenance_runs``' CHECK ``name`` (``before``) with ``after``."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(name, "maintenance_runs", type_="check")
        op.create_check_constraint(name, "maintenance_runs", after)
        return
    edit_sqlite_table("maintenance_runs", before, after)


def edit_sqlite_table(table: str, before: str, after: str) -> None:
    """Replace the text ``before`` (found once) with ``after`` in a SQLite table's definition.

    SQLite cannot alter a CHECK or a NOT NULL, and rebuilding the table would fail the foreign
    keys of its children inside this transaction. Its documented procedure for loosening a
    constraint edits the table's definition in place (sqlite.org/lang_altertable.html, "Making
    Other Kinds Of Table Schema Changes"); only loosening keeps every row valid."""
    bind = op.get_bind()
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).scalar_one()
    if sql.count(before) != 1:
        raise RuntimeError(f"{table} has no ({before}) to change: {sql}")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
        (sql.replace(before, after), table),
    )
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    if bind.exec_driver_sql("PRAGMA quick_check").scalar_one() != "ok":
        raise RuntimeError(f"SQLite reports damage after changing the definition of {table}")
