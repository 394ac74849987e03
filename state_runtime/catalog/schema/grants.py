"""Least privilege on PostgreSQL: the catalog's four roles and the SQL that grants their rights.

- owner: owns the schema; the only role that runs DDL (``python -m state_runtime.catalog
  upgrade``) and these grants.
- runtime: what a streaming job does: register stores and their schema histories, record
  batch intents, files, commits, holders, batch metrics and watermarks. SELECT, INSERT and
  UPDATE on those tables, INSERT on ``store_problems`` (the loss behind a batch it cannot
  load) and ``root_queries`` (its commits' (root, query) pairs, by trigger), SELECT on the
  rest; no DELETE, no DDL. On the tables that hold history (``stores``,
  ``checkpoint_files``, ``commit_log``, ``store_problems``) its UPDATE is narrowed to the
  protocol's own transitions: column grants (a store's latest version and schemas, a
  file's state, a replayed commit's checkpoint, a problem's resolution) and a trigger
  (:data:`GUARD_SQL`) that refuses, for any role without DELETE, every other change of those
  columns: a file moves to ``committed`` only when the commit log names its
  checkpoint, to ``orphan`` only when it no longer does; a commit entry changes only at its
  store's latest version (a replay replaces a version with no successor) and names only a
  recorded file of its own store and version (or, for a version that changed nothing, no
  file and its previous version's checkpoint); a store's latest version never moves back and
  is one the commit log holds; a problem moves from open to resolved, once, and only when it
  names a recorded file whose checkpoint no commit of the store at or above its version
  holds (a replay replaced it). So one statement (``UPDATE checkpoint_files SET state =
  'orphan'``) cannot doom the committed files of a store, nor one hide a store's damage.
- maintenance: the runtime's rights plus what snapshots, cleanup, validation, repair and
  leases need: INSERT, UPDATE and DELETE on every table but the owner's (the schema's
  revision and the role names); no DDL.
- reader: SELECT on the operators' views only
  (:mod:`~state_runtime.catalog.schema.operator_views`, the reading views of
  :mod:`~state_runtime.catalog.schema.reading_views` included), no table: on PostgreSQL a
  view reads its tables with its owner's rights. No view is writable by any role.

``grants --apply`` records the role names in ``catalog_roles``; every upgrade then applies
the same grants again, as its last step in its transaction (``migrations/env.py``), so the
tables a migration adds and the views it recreates carry their rights without a manual step.
Default privileges cover a table the owner creates outside a migration (readable by the
runtime and maintenance, writable by maintenance). Rendered as SQL (printed, or applied as
the owner in one transaction), never built from unchecked input: role names are checked
identifiers, quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from state_runtime.catalog.connection.engine import RetryPolicy, run_transaction
from state_runtime.catalog.schema import operator_views as views
from state_runtime.catalog.schema.tables import (
    batch_intents,
    batch_metrics,
    batch_watermarks,
    catalog_roles,
    checkpoint_files,
    commit_log,
    operator_layouts,
    operator_schemas,
    root_queries,
    state_schemas,
    store_holders,
    store_problems,
    stores,
)
from state_runtime.errors import InvalidArgument

RUNTIME_WRITES = tuple(
    t.name
    for t in (
        stores,
        checkpoint_files,
        commit_log,
        batch_metrics,
        store_holders,
        batch_watermarks,
        batch_intents,
        state_schemas,
        operator_schemas,
        operator_layouts,
    )
)
"""The tables a streaming job inserts into and updates (never deletes from)."""
RUNTIME_INSERTS = (store_problems.name, root_queries.name)
"""The tables a streaming job inserts into without a table-wide UPDATE: the problem behind a
batch it cannot load (``runtime/loss.py``), so that ``health`` calls the store broken; the
(root, query) pair its commit adds (the commit log's trigger, with the committer's rights). It
resolves one only as a commit that replaced the file's checkpoint (see
:data:`GUARDED_UPDATES`); every other resolution is maintenance's (a validation, a restore,
an operator)."""
GUARDED_UPDATES: dict[str, tuple[str, ...]] = {
    stores.name: (
        "key_schema",
        "value_schema",
        "latest_version",
        "latest_checkpoint_id",
        "last_committed_at",
    ),
    checkpoint_files.name: ("state", "state_changed_at", "state_reason"),
    commit_log.name: ("checkpoint_id", "file_id", "committed_at"),
    store_problems.name: ("resolved_at", "resolution"),
}
"""The columns the runtime may update in the tables that hold history (and no other)."""
GUARD_SQL = """
CREATE OR REPLACE FUNCTION {s}.state_protocol_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  committed boolean;
  named boolean;
  latest boolean;
  unneeded boolean;
BEGIN
  IF has_table_privilege(TG_RELID, 'DELETE') THEN
    RETURN NEW;  -- the owner and maintenance: restore, repair and cleanup move history
  END IF;
  IF TG_TABLE_NAME = 'checkpoint_files' THEN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
      committed := EXISTS (SELECT 1 FROM {s}.commit_log c WHERE c.store_id = OLD.store_id
        AND c.version = OLD.version AND c.checkpoint_id = OLD.checkpoint_id);
      IF NOT ((OLD.state IN ('written', 'orphan') AND NEW.state = 'committed' AND committed)
          OR (OLD.state IN ('written', 'committed') AND NEW.state = 'orphan' AND NOT committed))
      THEN
        RAISE EXCEPTION 'permission denied: file % (store %, version %) may not move from % '
          'to % (the commit log %)', OLD.path, OLD.store_id, OLD.version, OLD.state,
          NEW.state, CASE WHEN committed THEN 'names it' ELSE 'does not name it' END
          USING ERRCODE = 'insufficient_privilege';
      END IF;
    END IF;
  ELSIF TG_TABLE_NAME = 'commit_log' THEN
    named := CASE WHEN NEW.file_id IS NULL THEN  -- a version that changed nothing
      NOT EXISTS (SELECT 1 FROM {s}.checkpoint_files f WHERE f.store_id = NEW.store_id
        AND f.version = NEW.version AND f.checkpoint_id = NEW.checkpoint_id)
      AND (NEW.version = 1 OR EXISTS (SELECT 1 FROM {s}.commit_log c
        WHERE c.store_id = NEW.store_id AND c.version = NEW.version - 1
        AND c.checkpoint_id = NEW.checkpoint_id))
    ELSE EXISTS (SELECT 1 FROM {s}.checkpoint_files f WHERE f.file_id = NEW.file_id
        AND f.store_id = NEW.store_id AND f.version = NEW.version
        AND f.checkpoint_id = NEW.checkpoint_id) END;
    IF NOT named THEN
      RAISE EXCEPTION 'permission denied: the commit of store %, version % may name only a '
        'recorded file of that version (not file %, checkpoint %)', NEW.store_id,
        NEW.version, NEW.file_id, NEW.checkpoint_id USING ERRCODE = 'insufficient_privilege';
    END IF;
    latest := EXISTS (SELECT 1 FROM {s}.stores s WHERE s.store_id = OLD.store_id
      AND s.latest_version = OLD.version);
    IF NOT latest THEN  -- a replay replaces only a version with no successor
      RAISE EXCEPTION 'permission denied: the commit of store %, version % is not its '
        'latest: a committed version below the latest is history', OLD.store_id, OLD.version
        USING ERRCODE = 'insufficient_privilege';
    END IF;
  ELSIF TG_TABLE_NAME = 'store_problems' THEN
    unneeded := EXISTS (SELECT 1 FROM {s}.checkpoint_files f WHERE f.store_id = OLD.store_id
      AND f.path = OLD.path AND NOT EXISTS (SELECT 1 FROM {s}.commit_log c
        WHERE c.store_id = f.store_id AND c.version >= f.version
        AND c.checkpoint_id = f.checkpoint_id));
    IF NOT (OLD.resolved_at IS NULL AND NEW.resolved_at IS NOT NULL AND unneeded) THEN
      RAISE EXCEPTION 'permission denied: problem % of store % (file %) may only be resolved, '
        'once, when no committed version reads its file', OLD.problem_id, OLD.store_id,
        OLD.path USING ERRCODE = 'insufficient_privilege';
    END IF;
  ELSIF (NEW.latest_version, NEW.latest_checkpoint_id)
      IS DISTINCT FROM (OLD.latest_version, OLD.latest_checkpoint_id)
    AND NOT EXISTS (SELECT 1 FROM {s}.commit_log c WHERE c.store_id = NEW.store_id
      AND c.version = NEW.latest_version AND c.checkpoint_id = NEW.latest_checkpoint_id) THEN
    RAISE EXCEPTION 'permission denied: store % may not name version % (%) as its latest: '
      'the commit log does not hold it', NEW.store_id, NEW.latest_version,
      NEW.latest_checkpoint_id USING ERRCODE = 'insufficient_privilege';
  ELSIF NEW.latest_version < OLD.latest_version THEN
    RAISE EXCEPTION 'permission denied: store % may not move back from version % to %',
      NEW.store_id, OLD.latest_version, NEW.latest_version
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$
"""
"""The trigger function that holds a role without DELETE (the runtime) to the protocol's
transitions on the tables of :data:`GUARDED_UPDATES` (see the module docstring)."""


def guard_sql(s: str) -> list[str]:
    """The guard's function and its trigger on each guarded table of schema ``s`` (quoted)."""
    statements = [GUARD_SQL.replace("{s}", s).strip()]
    for table in GUARDED_UPDATES:
        statements += [
            f"DROP TRIGGER IF EXISTS state_protocol_guard ON {s}.{_ident(table)}",
            f"CREATE TRIGGER state_protocol_guard BEFORE UPDATE ON {s}.{_ident(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.state_protocol_guard()",
        ]
    return statements


OWNER_TABLES = ("alembic_version", catalog_roles.name)
"""The tables only the owner writes: the schema's revision and the role names."""
_ROLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _ident(name: str) -> str:
    if not _ROLE_RE.match(name):
        raise InvalidArgument(
            f"invalid role or schema name {name!r}: expected 1-63 lower-case letters, digits "
            "or underscores, not starting with a digit"
        )
    return f'"{name}"'


@dataclass(frozen=True)
class Roles:
    """The names of the catalog's roles (overridable: one set per catalog, say)."""

    owner: str
    runtime: str = "state_runtime"
    maintenance: str = "state_maintenance"
    reader: str = "state_reader"

    def __post_init__(self) -> None:
        names = [self.owner, self.runtime, self.maintenance, self.reader]
        for name in names:
            _ident(name)
        if len(set(names)) != len(names):
            raise InvalidArgument(f"the four catalog roles need four distinct names: {names}")


def reader_views() -> list[str]:
    """The views the reader may select from: every view the catalog renders on PostgreSQL."""
    return [d.name for d in views.rendered("postgresql") if d.kind == "VIEW"]


def grants_sql(roles: Roles, schema: str) -> list[str]:
    """The statements that create the three roles (NOLOGIN, if missing), grant their rights
    in ``schema`` and record the four names; run as ``roles.owner``. Safe to run again."""
    s = _ident(schema)
    owner, runtime = _ident(roles.owner), _ident(roles.runtime)
    maintenance, reader = _ident(roles.maintenance), _ident(roles.reader)
    users = f"{runtime}, {maintenance}, {reader}"
    statements = [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
        f'CREATE ROLE "{name}" NOLOGIN; END IF; END $$'
        for name in (roles.runtime, roles.maintenance, roles.reader)
    ]
    written = ", ".join(f"{s}.{_ident(t)}" for t in RUNTIME_WRITES)
    guarded = ", ".join(f"{s}.{_ident(t)}" for t in GUARDED_UPDATES)
    owners = ", ".join(f"{s}.{_ident(t)}" for t in OWNER_TABLES)
    read = ", ".join(f"{s}.{_ident(v)}" for v in reader_views())
    default = f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {s}"
    statements += [
        f"REVOKE CREATE ON SCHEMA {s} FROM {users}",
        f"GRANT USAGE ON SCHEMA {s} TO {users}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {reader}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {runtime}, {maintenance}",
        f"GRANT INSERT, UPDATE ON {written} TO {runtime}",
        f"GRANT INSERT ON {', '.join(f'{s}.{_ident(t)}' for t in RUNTIME_INSERTS)} TO {runtime}",
        f"REVOKE UPDATE ON {guarded} FROM {runtime}",  # its column grants go with it
        *(
            f"GRANT UPDATE ({', '.join(columns)}) ON {s}.{_ident(table)} TO {runtime}"
            for table, columns in GUARDED_UPDATES.items()
        ),
        *guard_sql(s),
        f"GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {maintenance}",
        f"REVOKE INSERT, UPDATE, DELETE ON {owners} FROM {maintenance}",
        f"REVOKE INSERT, UPDATE, DELETE ON {read} FROM {runtime}, {maintenance}",
        f"GRANT SELECT ON {read} TO {reader}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {runtime}, {maintenance}",
        f"{default} REVOKE SELECT ON TABLES FROM {reader}",
        f"{default} GRANT SELECT ON TABLES TO {runtime}, {maintenance}",
        f"{default} GRANT INSERT, UPDATE, DELETE ON TABLES TO {maintenance}",
        f"{default} GRANT USAGE, SELECT ON SEQUENCES TO {runtime}, {maintenance}",
        f"DELETE FROM {s}.{_ident(catalog_roles.name)}",
        f"INSERT INTO {s}.{_ident(catalog_roles.name)} (kind, role_name) VALUES "
        + ", ".join(
            f"('{kind}', '{name}')"
            for kind, name in (
                ("owner", roles.owner),
                ("runtime", roles.runtime),
                ("maintenance", roles.maintenance),
                ("reader", roles.reader),
            )
        ),
    ]
    return statements


def reapply_grants(connection: Connection) -> bool:
    """Apply the grants again to the roles ``grants --apply`` recorded (the last step of an
    upgrade, as the owner, in its transaction); False if none were recorded (or SQLite)."""
    if connection.dialect.name != "postgresql":
        return False
    recorded = dict(
        connection.execute(sa.select(catalog_roles.c.kind, catalog_roles.c.role_name)).all()
    )
    if not recorded:
        return False
    schema = connection.execute(sa.text("SELECT current_schema()")).scalar_one()
    roles = Roles(recorded.pop("owner"), **recorded)
    _execute(connection, grants_sql(roles, schema))
    return True


def _execute(connection: Connection, statements: list[str]) -> None:
    """Run ``statements`` on the driver's own cursor: no %-parameter parsing (the guard's
    messages hold ``%``)."""
    cursor = connection.connection.cursor()
    try:
        for statement in statements:
            cursor.execute(statement)
    finally:
        cursor.close()


def catalog_grants(
    engine: Engine,
    *,
    runtime: str | None = None,
    maintenance: str | None = None,
    reader: str | None = None,
    owner: str | None = None,
    apply: bool = False,
) -> list[str]:
    """The grants for the catalog at ``engine`` (its current schema; the owner defaults to
    the connecting role); with ``apply``, run them there in one transaction."""
    if engine.dialect.name != "postgresql":
        raise InvalidArgument(
            "roles and grants are for a PostgreSQL catalog: a SQLite catalog is a single-user "
            "file, protected by its file permissions"
        )

    def work(connection: Connection) -> list[str]:
        found = connection.execute(sa.text("SELECT current_user, current_schema()")).one()
        names = {"runtime": runtime, "maintenance": maintenance, "reader": reader}
        roles = Roles(owner or found[0], **{k: v for k, v in names.items() if v is not None})
        statements = grants_sql(roles, found[1])
        if apply:
            _execute(connection, statements)
        return statements

    return run_transaction(
        engine, work, retry=RetryPolicy(), what="apply grants" if apply else "render grants"
    )
