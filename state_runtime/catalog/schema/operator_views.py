"""The operators' views and functions, rendered from the rules and recreated by every upgrade.

Migrations hold tables only. The views are derived objects, like Flyway's repeatable
migrations: every schema upgrade (``migrations/env.py``) drops them all and creates them again
from what this module renders for the database's dialect, so they always follow the code:

- the retention verdicts (``state_cleanup_preview``; on PostgreSQL also the functions
  ``state_retained_versions``, ``state_needed_files`` and ``state_file_verdicts``) are the
  catalog's own verdict query (:mod:`~state_runtime.catalog.sql.retention`, built from
  :data:`state_runtime.retention.RULES`) compiled for the dialect, with the reasons rendered
  from :data:`state_runtime.retention.REASONS`;
- each store's status (``state_store_health``; on PostgreSQL also ``state_store_status``) is
  rendered from the rule of :mod:`state_runtime.status`, its default thresholds included;
- history, lineage and deletions are plain SQL (:mod:`~state_runtime.catalog.schema.plain_views`);
- the reading views (``read_<table>``, :mod:`~state_runtime.catalog.schema.reading_views`),
  created first, are what every read query and the functions above select from.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect

from state_runtime import retention as rule
from state_runtime import status as status_rule
from state_runtime.catalog.records import DISK_FIGURES
from state_runtime.catalog.schema import reading_views as reading
from state_runtime.catalog.schema.plain_views import (
    DELETIONS,
    LINEAGE,
    PG_ROOT_URI,
    VERSION_HISTORY,
)
from state_runtime.catalog.schema.predicates import is_live, render
from state_runtime.catalog.schema.reading_views import READER_VIEWS
from state_runtime.catalog.sql.retention import (
    PolicySql,
    needed_from,
    offsets,
    retained_bases,
    verdicts,
)
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.status import health_of, status_of
from state_runtime.catalog.sql.store_facts import store_facts
from state_runtime.errors import CatalogError
from state_runtime.settings import MAINTENANCE, MIN_RETAINED_VERSIONS, Setting

Kind = Literal["VIEW", "FUNCTION"]


@dataclass(frozen=True)
class Derived:
    """One view or function: its name and the statements that create it (with comments)."""

    name: str
    kind: Kind
    statements: tuple[str, ...]


# --- rendering helpers --------------------------------------------------------------------


def quote(text: str) -> str:
    """A SQL string literal (both dialects)."""
    return "'" + text.replace("'", "''") + "'"


def template_sql(template: str, fields: Mapping[str, str]) -> str:
    """A ``str.format`` template as SQL: its literal parts quoted, each field replaced by the
    SQL expression (of type text) ``fields`` gives for it, joined with ``||``."""
    parts: list[str] = []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        if literal:
            parts.append(quote(literal))
        if field is not None:
            if spec or conversion:
                raise CatalogError(f"template field {{{field}}} may not carry a format: {template}")
            parts.append(f"({fields[field]})")
    return " || ".join(parts) or "''"


def text_of(expression: str) -> str:
    return f"CAST({expression} AS TEXT)"


def compiled(query: Any, dialect: Dialect) -> str:
    """A SQLAlchemy query as SQL text with its values inlined (for a view or function body)."""
    return str(query.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


_DIALECTS: Mapping[str, Callable[[], Dialect]] = {
    # named parameters: no %-doubling of the literals a body inlines
    "postgresql": lambda: postgresql.dialect(paramstyle="named"),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.dialect,
}


# --- the retention rule -------------------------------------------------------------------

VERDICT_COLUMNS = (
    "file_id, store_id, checkpoint_root, operator_id, partition_id, store_name, path, kind, "
    "version, checkpoint_id, state, verification, size_bytes, created_at, recorded_at, "
    "needed_from, needed_to"
)


@dataclass(frozen=True)
class PolicyText:
    """A retention policy as the reasons print it: SQL expressions of type text."""

    keep: str
    window: str
    grace: str


def reason_sql(policy: PolicyText, j: str = "j") -> str:
    """:data:`state_runtime.retention.REASONS` as a CASE over the verdict of row ``j`` (a row
    of :func:`~state_runtime.catalog.sql.retention.verdicts`)."""
    low, high = text_of(f"{j}.needed_from"), text_of(f"{j}.needed_to")
    needed_by = (
        f"CASE WHEN {j}.needed_from = {j}.needed_to "
        f"THEN {template_sql(rule.NEEDED_ONE, {'low': low})} "
        f"ELSE {template_sql(rule.NEEDED_RANGE, {'low': low, 'high': high})} END"
    )
    F = rule.ReasonField
    fields = {
        F.KEEP: policy.keep,
        F.WINDOW: policy.window,
        F.GRACE: policy.grace,
        F.NEEDED_BY: needed_by,
        F.RUN: f"coalesce({text_of(f'{j}.claimed_by_run')}, 'None')",
        F.STATE_REASON: f"coalesce({j}.state_reason, 'None')",
        F.NOTE: f"coalesce(nullif({j}.verification_note, ''), {quote(rule.NOTE_UNKNOWN)})",
        F.REPLACED: (
            f"CASE WHEN {j}.above_floor THEN {quote(rule.SUPERSEDED_BECAUSE[True])} "
            f"ELSE {quote(rule.SUPERSEDED_BECAUSE[False])} END"
        ),
    }
    by_name = {field.value: sql for field, sql in fields.items()}
    cases = "\n".join(
        f"  WHEN {quote(verdict.value)} THEN {template_sql(template, by_name)}"
        for verdict, template in rule.REASONS.items()
    )
    return f"CASE {j}.verdict\n{cases}\nEND"


def verdicts_sql(policy: PolicySql, text: PolicyText, dialect: Dialect) -> str:
    """Every live or claimed file with its verdict and reason, as the catalog computes them."""
    query = compiled(verdicts(READER_VIEWS, policy, Scope(), only_deletable=False), dialect)
    return (
        f"SELECT {', '.join(f'j.{c.strip()}' for c in VERDICT_COLUMNS.split(','))},\n"
        f"  CAST(j.verdict AS TEXT) AS verdict,\n  {reason_sql(text)} AS reason\n"
        f"FROM ({query}) AS j"
    )


def duration_text(value: timedelta) -> str:
    return quote(str(value))


def sqlite_cutoff(age: timedelta) -> sa.ColumnElement[Any]:
    """``now - age`` as SQLite compares it with stored timestamps (UTC text)."""
    seconds = f"{-age.total_seconds():+g} seconds"
    return sa.literal_column(f"strftime('%Y-%m-%d %H:%M:%f', 'now', {quote(seconds)})")


def pg_offsets(parameter: str) -> sa.FromClause:
    """The offsets of the retained versions for a ``retain_versions`` function parameter (never
    fewer than the safety floor)."""
    count = sa.func.greatest(sa.literal_column(parameter), MIN_RETAINED_VERSIONS)
    return sa.select(sa.func.generate_series(0, count - 1).label("k")).subquery("back")


PG_DURATION_TEXT = """
CREATE FUNCTION state_duration_text(d interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    -- Python's str(timedelta): '1:00:00', '0:00:30.500000', '2 days, 3:04:05'
    SELECT CASE WHEN days = 0 THEN '' WHEN abs(days) = 1 THEN days || ' day, '
                ELSE days || ' days, ' END
           || rest / 3600000000 || ':' || lpad((rest / 60000000 % 60)::text, 2, '0')
           || ':' || lpad((rest / 1000000 % 60)::text, 2, '0')
           || CASE WHEN rest % 1000000 = 0 THEN ''
                   ELSE '.' || lpad((rest % 1000000)::text, 6, '0') END
    FROM (SELECT days, micros - days * 86400000000 AS rest
          FROM (SELECT floor(micros / 86400000000.0)::bigint AS days, micros
                FROM (SELECT (extract(epoch FROM d) * 1000000)::bigint AS micros) m) d) r
$$
"""


PG_FUNCTION_POLICY = PolicySql(
    pg_offsets("$1"),
    sa.literal_column("now() - $2"),
    sa.literal_column("now() - greatest($2, $3)"),
)
"""The policy of a PostgreSQL function's parameters (retain_versions, retention, orphan_grace)."""


def pg_interval(value: timedelta) -> str:
    return f"interval '{value.total_seconds():g} seconds'"


def default_policy(dialect: str) -> PolicySql:
    """The default retention policy as a view reads it, by the database's clock."""
    default = rule.RetentionPolicy()
    if dialect == "postgresql":
        return PolicySql(
            offsets(default.retain_versions),
            sa.literal_column(f"now() - {pg_interval(default.window)}"),
            sa.literal_column(f"now() - {pg_interval(default.grace)}"),
        )
    return PolicySql(
        offsets(default.retain_versions),
        sqlite_cutoff(default.window),
        sqlite_cutoff(default.grace),
    )


def _policy_defaults(dialect: str) -> Derived:
    """``state_policy_defaults``: each maintenance setting's default, one column each (what
    the psql scripts fall back on)."""

    def value(setting: Setting) -> str:
        if isinstance(setting.default, timedelta):
            if dialect == "postgresql":
                return pg_interval(setting.default)
            return duration_text(setting.default)
        return str(setting.default)

    columns = ",\n       ".join(
        f'{value(setting)} AS "{setting.name}"'
        for setting in MAINTENANCE
        if setting.default is not None
    )
    return Derived(
        "state_policy_defaults",
        "VIEW",
        (f"CREATE VIEW state_policy_defaults AS\nSELECT {columns}",),
    )


def _retention_pg(dialect: Dialect) -> list[Derived]:
    back = pg_offsets("$1")
    retained = retained_bases(READER_VIEWS, back, Scope())
    needed = needed_from(READER_VIEWS, retained_bases(READER_VIEWS, pg_offsets("$1"), Scope()))
    function_policy = PG_FUNCTION_POLICY
    text = PolicyText(
        keep=text_of(f"greatest($1, {MIN_RETAINED_VERSIONS})"),
        window="state_duration_text($2)",
        grace="state_duration_text(greatest($2, $3))",
    )
    default = rule.RetentionPolicy()
    return [
        Derived("state_duration_text", "FUNCTION", (PG_DURATION_TEXT,)),
        Derived(
            "state_retained_versions",
            "FUNCTION",
            (
                "CREATE FUNCTION state_retained_versions(retain_versions integer)\n"
                "RETURNS TABLE (store_id bigint, retained_version bigint, base_version bigint)\n"
                f"LANGUAGE sql STABLE AS $$\n{compiled(sa.select(retained), dialect)}\n$$",
                "COMMENT ON FUNCTION state_retained_versions(integer) IS 'The last N committed "
                f"versions (N >= {MIN_RETAINED_VERSIONS}) of each store, above its "
                "expired_through, and the verified snapshot each loads from.'",
            ),
        ),
        Derived(
            "state_needed_files",
            "FUNCTION",
            (
                "CREATE FUNCTION state_needed_files(retain_versions integer)\n"
                "RETURNS TABLE (file_id bigint, store_id bigint, retained_version bigint)\n"
                f"LANGUAGE sql STABLE AS $$\n{compiled(needed, dialect)}\n$$",
                "COMMENT ON FUNCTION state_needed_files(integer) IS 'Files each of the last N "
                f"committed versions (N >= {MIN_RETAINED_VERSIONS}) loads through (verified "
                "snapshots only).'",
            ),
        ),
        Derived(
            "state_file_verdicts",
            "FUNCTION",
            (
                "CREATE FUNCTION state_file_verdicts(\n"
                "    retain_versions integer, retention interval, orphan_grace interval)\n"
                "RETURNS TABLE (\n"
                "    file_id bigint, store_id bigint, checkpoint_root text, operator_id integer,\n"
                "    partition_id integer, store_name varchar, path text, kind varchar,\n"
                "    version bigint, checkpoint_id varchar, state varchar, verification varchar,\n"
                "    size_bytes bigint, created_at timestamptz, recorded_at timestamptz,\n"
                "    needed_from bigint, needed_to bigint, verdict text, reason text)\n"
                f"LANGUAGE sql STABLE AS $$\n{verdicts_sql(function_policy, text, dialect)}\n$$",
                "COMMENT ON FUNCTION state_file_verdicts(integer, interval, interval) IS "
                "'Every live or claimed file: why it is kept or why cleanup may delete it.'",
            ),
        ),
        Derived(
            "state_cleanup_preview",
            "VIEW",
            (
                "CREATE VIEW state_cleanup_preview AS\nSELECT * FROM state_file_verdicts("
                f"{default.retain_versions}, {pg_interval(default.window)}, "
                f"{pg_interval(default.orphan_grace)})",
            ),
        ),
    ]


def _retention_sqlite(dialect: Dialect) -> list[Derived]:
    default = rule.RetentionPolicy()
    policy = default_policy("sqlite")
    text = PolicyText(
        keep=quote(str(default.retain_versions)),
        window=duration_text(default.window),
        grace=duration_text(default.grace),
    )
    body = verdicts_sql(policy, text, dialect)
    return [
        Derived("state_cleanup_preview", "VIEW", (f"CREATE VIEW state_cleanup_preview AS\n{body}",))
    ]


# --- the status rule ----------------------------------------------------------------------


def _status(dialect: Dialect, default: PolicySql, function: PolicySql | None) -> list[Derived]:
    """``state_store_facts`` (:func:`~state_runtime.catalog.sql.store_facts.store_facts` at the
    default policy) and ``state_store_health`` (the facts with the status rule of
    :mod:`state_runtime.status` at the default limits); on PostgreSQL also both for any policy
    and limits (``state_store_facts_at``, ``state_store_health_at``) and ``state_store_status``."""
    name = dialect.name
    facts = store_facts(READER_VIEWS, default, Scope())
    columns = [c.name for c in facts.selected_columns]
    facts_view = sa.table("state_store_facts", *map(sa.column, columns)).alias("f")
    defaults = {limit: sa.literal(value) for limit, value in status_rule.DEFAULT_LIMITS.items()}
    facts_sql = compiled(facts, dialect)
    health_sql = compiled(health_of(facts_view, defaults, name), dialect)
    thresholds = ", ".join(f"{k} {v}" for k, v in status_rule.DEFAULT_LIMITS.items())
    derived = [
        Derived("state_store_facts", "VIEW", (f"CREATE VIEW state_store_facts AS\n{facts_sql}",)),
        Derived(
            "state_store_health", "VIEW", (f"CREATE VIEW state_store_health AS\n{health_sql}",)
        ),
    ]
    if function is None:
        return derived
    policy_args = "retain_versions integer, retention interval, orphan_grace interval"
    limit_args = ", ".join(f"{limit} integer" for limit in status_rule.LIMITS)
    at: dict[str, Any] = {
        limit: sa.literal_column(f"${i}") for i, limit in enumerate(status_rule.LIMITS, 4)
    }
    own: dict[str, Any] = {
        limit: sa.literal_column(f"${i}") for i, limit in enumerate(status_rule.LIMITS, 1)
    }
    facts_at = (
        sa.func.state_store_facts_at(*(sa.literal_column(f"${i}") for i in (1, 2, 3)))
        .table_valued(*columns)
        .alias("f")
    )
    types = ", ".join("integer" for _ in status_rule.LIMITS)
    comment = (
        f"One row per store with its status at the default thresholds ({thresholds}) and its "
        "reclaimable files at the default retention policy (state_store_health_at(...) for "
        "others)."
    )
    return [
        *derived,
        Derived(
            "state_store_facts_at",
            "FUNCTION",
            (
                f"CREATE FUNCTION state_store_facts_at({policy_args})\n"
                "RETURNS SETOF state_store_facts LANGUAGE sql STABLE AS $$\n"
                f"{compiled(store_facts(READER_VIEWS, function, Scope()), dialect)}\n$$",
                "COMMENT ON VIEW state_store_facts IS 'The catalog facts each store''s status "
                "is derived from, reclaimable files at the default retention policy "
                "(state_store_facts_at(...) for others).'",
            ),
        ),
        Derived(
            "state_store_health_at",
            "FUNCTION",
            (
                f"CREATE FUNCTION state_store_health_at({policy_args}, {limit_args})\n"
                "RETURNS SETOF state_store_health LANGUAGE sql STABLE AS $$\n"
                f"{compiled(health_of(facts_at, at, name), dialect)}\n$$",
                f"COMMENT ON VIEW state_store_health IS {quote(comment)}",
            ),
        ),
        Derived(
            "state_store_status",
            "FUNCTION",
            (
                f"CREATE FUNCTION state_store_status({limit_args})\n"
                "RETURNS TABLE (store_id bigint, status text, status_reason text, "
                "status_since timestamptz, status_recorded boolean)\nLANGUAGE sql STABLE AS $$\n"
                f"{compiled(status_of(facts_view, own, name), dialect)}\n$$",
                f"COMMENT ON FUNCTION state_store_status({types}) IS 'Each store''s status "
                "(healthy, degraded, broken, unknown), why, and since when (status_recorded: since "
                "its recorded change, or else the facts'' estimate).'",
            ),
        ),
    ]


# --- plain views ------------------------------------------------------------------------

BATCH_FIGURES = (
    "batch_ms",
    "cache_hit_rate",
    "max_task_ms",
    "max_load_ms",
    "deltas_applied",
    "duplicate_attempts",
    "watermark_ms",
    "late_rows",
    "evicted",
)
"""The figures of ``batch_metrics.extra`` (written by ``StatefulQuery._metrics`` and
``event_time_metrics``) that ``state_batch_metrics`` shows as columns (NULL when absent)."""


def batch_metrics_view(dialect: str) -> str:
    """``state_batch_metrics``: one row per recorded micro-batch, its figures as columns."""

    def figure(name: str) -> str:
        if dialect == "postgresql":
            return f"(m.extra ->> {quote(name)})::double precision AS {name}"
        return f"json_extract(m.extra, {quote('$.' + name)}) AS {name}"

    return (
        "CREATE VIEW state_batch_metrics AS\n"
        "SELECT m.checkpoint_root, m.query_id, m.batch_id, m.recorded_at, m.rows_in,\n"
        "       m.keys_updated, m.state_rows, m.bytes_written, m.commit_ms, m.cache_hits,\n"
        "       m.cache_misses,\n       "
        + ",\n       ".join(
            [*(f"m.{name}" for name in DISK_FIGURES), *(figure(name) for name in BATCH_FIGURES)]
        )
        + "\nFROM batch_metrics m\n"
    )


def _plain(dialect: str) -> list[Derived]:
    derived = [
        Derived("state_version_history", "VIEW", (VERSION_HISTORY,)),
        Derived("state_lineage", "VIEW", (LINEAGE,)),
        Derived("state_deletions", "VIEW", (DELETIONS,)),
        Derived("state_batch_metrics", "VIEW", (batch_metrics_view(dialect),)),
    ]
    if dialect == "postgresql":
        comment = (
            "COMMENT ON FUNCTION state_root_uri(text) IS 'A checkpoint root as the catalog "
            "records it: a plain path becomes its file:// URI.'"
        )
        derived.append(Derived("state_root_uri", "FUNCTION", (PG_ROOT_URI, comment)))
        live = (  # the predicate of catalog/schema/predicates.py, for the psql scripts
            "CREATE FUNCTION state_is_live(state text) RETURNS boolean LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT {render(is_live)} $$"
        )
        derived.append(Derived("state_is_live", "FUNCTION", (live,)))
    return derived


# --- the reading views -------------------------------------------------------------------


def _reading() -> list[Derived]:
    """``read_<table>`` for each readable table, and the schema's revision."""
    derived = [
        Derived(
            reading.PREFIX + table.name,
            "VIEW",
            (
                f"CREATE VIEW {reading.PREFIX}{table.name} AS\n"
                f"SELECT {', '.join(c.name for c in table.c)} FROM {table.name}",
            ),
        )
        for table in reading.READABLE
    ]
    revision = f"CREATE VIEW {reading.REVISION_VIEW} AS SELECT version_num FROM alembic_version"
    return [*derived, Derived(reading.REVISION_VIEW, "VIEW", (revision,))]


# --- all of them --------------------------------------------------------------------------


@functools.cache
def rendered(dialect: str) -> tuple[Derived, ...]:
    """Every view and function of ``dialect`` ('postgresql' or 'sqlite'), in creation order.
    Rendered once per process: they follow from the code alone."""
    if dialect not in _DIALECTS:
        raise CatalogError(f"the catalog's views are not rendered for {dialect!r}")
    compiler = _DIALECTS[dialect]()
    postgres = dialect == "postgresql"
    retention = _retention_pg(compiler) if postgres else _retention_sqlite(compiler)
    status = _status(compiler, default_policy(dialect), PG_FUNCTION_POLICY if postgres else None)
    return (
        *_reading(),
        _policy_defaults(dialect),
        *_plain(dialect),
        *retention,
        *status,
    )


@functools.cache
def names() -> tuple[str, ...]:
    """Every name this module ever creates, on any dialect (what an upgrade drops first)."""
    seen: dict[str, Kind] = {}
    for dialect in _DIALECTS:
        seen.update({d.name: d.kind for d in rendered(dialect)})
    return tuple(seen)


def drop(connection: Connection) -> None:
    """Drop every view and function this module creates, those an older version created
    included (they carry the same names), so that migrations meet the tables alone."""
    postgres = connection.dialect.name == "postgresql"
    for name in reversed(names()):
        if postgres:  # either kind: an older version may have made it the other
            connection.exec_driver_sql(f"DROP VIEW IF EXISTS {name} CASCADE")
            connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {name} CASCADE")
        else:
            connection.exec_driver_sql(f"DROP VIEW IF EXISTS {name}")


def create(connection: Connection) -> None:
    """Create every view and function of the connection's dialect (the schema at head)."""
    cursor = connection.connection.cursor()  # the driver's own: no %-parameter parsing
    try:
        for derived in rendered(connection.dialect.name):
            for statement in derived.statements:
                cursor.execute(statement)
    finally:
        cursor.close()


def recreate(connection: Connection) -> None:
    drop(connection)
    create(connection)
