"""Widening a CHECK constraint of ``maintenance_runs`` in a migration, on both dialects."""

from __future__ import annotations

from alembic import op


def swap_runs_check(name: str, before: str, after: str) -> None:
    """Replace ``maintenance_runs``' CHECK ``name`` (``before``) with ``after``."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(name, "maintenance_runs", type_="check")
        op.create_check_constraint(name, "maintenance_runs", after)
        return
    # SQLite cannot alter a CHECK, and rebuilding the table would fail the foreign keys of
    # its children inside this transaction. Its documented procedure for loosening a
    # constraint edits the table's definition in place (sqlite.org/lang_altertable.html,
    # "Making Other Kinds Of Table Schema Changes"); widening an IN list keeps every row valid.
    bind = op.get_bind()
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'maintenance_runs'"
    ).scalar_one()
    if sql.count(before) != 1:
        raise RuntimeError(f"maintenance_runs has no CHECK ({before}) to change: {sql}")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'maintenance_runs'",
        (sql.replace(before, after),),
    )
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    if bind.exec_driver_sql("PRAGMA quick_check").scalar_one() != "ok":
        raise RuntimeError(f"SQLite reports damage after changing the runs' CHECK {name}")
