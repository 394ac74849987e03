"""The retention rule of :mod:`state_runtime.retention` translated to SQL: retained versions,
needed files and each file's verdict.

The rule (what a retained version needs, the floor, the verdicts and their order, the reasons)
lives in ``state_runtime/retention.py``; this module only says how each of its facts reads in
SQL (:func:`fact_sql`) and builds the verdict from :data:`~state_runtime.retention.RULES`, so
that plans over thousands of stores stay a few set-based queries. The deletions it allows are
claimed and recorded in :mod:`~state_runtime.catalog.sql.deletions`; ``explain`` is
:mod:`~state_runtime.catalog.sql.explanations`; the operators' views render the same queries
(:mod:`~state_runtime.catalog.schema.operator_views`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from state_runtime import retention as rule
from state_runtime.catalog.records import (
    FileRecord,
    FileVerdict,
    RetainedVersion,
    StoreKey,
)
from state_runtime.catalog.schema.predicates import (
    constant,
    is_live,
    is_verified_snapshot_by_commit_log,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import FileState, Verification
from state_runtime.catalog.sql.lookups import store_ids
from state_runtime.catalog.sql.rows import FILE_COLUMNS, AnyRow, file_columns, file_record
from state_runtime.catalog.sql.scope import Scope
from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.retention import Fact, RetentionPolicy, Verdict


def _verified_snapshot(views: ReaderViews, f: Any) -> ColumnElement[bool]:
    """A snapshot a retained version may load from (the commit log names it)."""
    return is_verified_snapshot_by_commit_log(f, views.commits.alias("naming"))


@dataclass(frozen=True)
class PolicySql:
    """A retention policy as the SQL reads it: the offsets ``k`` of the retained versions
    (``latest - k``; a FROM clause with the column ``k``) and the two cutoffs (values from the
    database's clock, or SQL such as ``now() - retention`` in the operators' functions)."""

    offsets: sa.FromClause
    committed_cutoff: Any
    uncommitted_cutoff: Any

    @staticmethod
    def of(policy: RetentionPolicy, now: datetime) -> PolicySql:
        return PolicySql(
            offsets(policy.retain_versions),
            policy.committed_cutoff(now),
            policy.uncommitted_cutoff(now),
        )

    @staticmethod
    def bound(views: ReaderViews, retain_versions: int) -> PolicySql:
        """The cutoffs as the bind parameters ``committed_cutoff`` and ``uncommitted_cutoff``
        (:meth:`cutoffs` gives their values), for a statement built once."""
        at = views.files.c.created_at.type
        return PolicySql(
            offsets(retain_versions),
            sa.bindparam("committed_cutoff", type_=at),
            sa.bindparam("uncommitted_cutoff", type_=at),
        )

    @staticmethod
    def cutoffs(policy: RetentionPolicy, now: datetime) -> dict[str, datetime]:
        """The values of :meth:`bound`'s parameters for ``policy`` at ``now``."""
        return {
            "committed_cutoff": policy.committed_cutoff(now),
            "uncommitted_cutoff": policy.uncommitted_cutoff(now),
        }


def offsets(retain_versions: int) -> sa.FromClause:
    """``k`` for ``k < retain_versions``, as literal rows (the planner sees each one)."""
    return sa.union_all(
        *(sa.select(sa.literal(k, sa.BigInteger()).label("k")) for k in range(retain_versions))
    ).subquery("back")


def retained_bases(views: ReaderViews, back: sa.FromClause, scope: Scope) -> sa.CTE:
    """(store_id, retained_version, base_version): each retained version and the verified
    snapshot it loads from (0: none).

    Commits keep each store's committed versions one linear, gapless chain (version v builds
    on the committed v - 1), so the retained versions are ``latest - k`` for
    ``k < retain_versions``, above the store's ``expired_through``, and the loader's walk has
    a closed form: retained version r loads from the newest verified committed snapshot at or
    below r (version s) and the committed deltas s+1..r. Each part is an index lookup on the
    live inventory, so the cost does not grow with history (a recursive CTE over base ids is
    blind to PostgreSQL's planner, which then re-hashes the inventory at every step of the
    walk).
    """
    s = views.stores.c
    version = s.latest_version - back.c.k
    snap = views.files.alias("snap")
    base_version = (
        sa.select(sa.func.max(snap.c.version))
        .where(
            snap.c.store_id == s.store_id,
            _verified_snapshot(views, snap.c),
            snap.c.version <= version,
        )
        .scalar_subquery()
    )
    return (
        sa.select(
            s.store_id,
            version.label("retained_version"),
            sa.func.coalesce(base_version, 0).label("base_version"),
        )
        .select_from(views.stores)
        .join(back, sa.true())
        .where(version >= 1, version > s.expired_through, scope.filter(views, s.store_id))
        .cte("retained")
    )


def needed_from(
    views: ReaderViews, retained: sa.CTE, scope: Scope | None = None
) -> sa.CompoundSelect[Any]:
    """(file_id, store_id, retained_version): the base snapshot of each retained version and
    the deltas that the commit log's entries above that base name (a version that changed
    nothing names none). The commit log decides, not the files' states: a file a retained
    commit needs is needed whatever its row's state says, so no deletion can claim it.

    ``scope``, the one ``retained`` was read for, also bounds the snapshots' files: implied by
    the join, but without it SQLite (no statistics) drives the join from the live index of
    every store in the catalog and probes ``retained`` for each, so a claim of 1,000 files read
    all 5,000,000 of a backlog's (25 s, holding the write lock the pass's workers wait on)."""
    f = views.files.alias("needed_file")
    c = views.commits.alias("step")
    r = retained.c
    bound = (
        [scope.filter(views, f.c.store_id)]
        if scope is not None and (scope.store_ids is not None or scope.root is not None)
        else []  # the whole catalog (the operator views' function): no condition, as before
    )
    snapshots = (
        sa.select(f.c.file_id, f.c.store_id, r.retained_version)
        .select_from(retained)
        .join(f, sa.and_(f.c.store_id == r.store_id, f.c.version == r.base_version))
        .where(_verified_snapshot(views, f.c), *bound)
    )
    deltas = (
        sa.select(f.c.file_id, f.c.store_id, r.retained_version)
        .select_from(retained)
        .join(
            c,
            sa.and_(
                c.c.store_id == r.store_id,
                c.c.version > r.base_version,
                c.c.version <= r.retained_version,
            ),
        )
        .join(f, f.c.file_id == c.c.file_id)
        .where(f.c.kind == constant(FileKind.DELTA), is_live(f.c))
    )
    return sa.union_all(snapshots, deltas)


def needed_files(views: ReaderViews, retain_versions: int, scope: Scope) -> sa.CompoundSelect[Any]:
    """(file_id, store_id, retained_version): each file a retained version loads through."""
    return needed_from(views, retained_bases(views, offsets(retain_versions), scope), scope)


def fact_sql(
    views: ReaderViews,
    *,
    needed: ColumnElement[bool],
    floor: ColumnElement[int],
    held: ColumnElement[bool],
    policy: PolicySql,
) -> Mapping[Fact, ColumnElement[bool]]:
    """Each fact of the rule about a ``checkpoint_files`` row, in SQL (``needed``, ``floor``
    and ``held`` come from the joins :func:`verdicts` makes)."""
    f = views.files.c
    snapshot = f.kind == constant(FileKind.SNAPSHOT)
    return {
        Fact.NEEDED: needed,
        Fact.CLAIMED: f.state == constant(FileState.DELETING),
        Fact.COMMITTED: f.state == constant(FileState.COMMITTED),
        Fact.ORPHAN: f.state == constant(FileState.ORPHAN),
        Fact.DAMAGED: sa.and_(snapshot, f.verification == constant(Verification.FAILED)),
        Fact.UNVERIFIED: sa.and_(snapshot, f.verification == constant(Verification.UNVERIFIED)),
        Fact.ABOVE_FLOOR: sa.and_(floor.is_not(None), f.version >= floor),
        Fact.STORE_HELD: held,
        Fact.PAST_WINDOW: _aged_by(views, policy.committed_cutoff),
        Fact.PAST_GRACE: _aged_by(views, policy.uncommitted_cutoff),
    }


def _aged_by(views: ReaderViews, cutoff: Any) -> ColumnElement[bool]:
    """The file's age starts at or before ``cutoff``: the later of its writer's ``created_at``
    and the catalog's ``recorded_at`` (:attr:`~state_runtime.retention.StoreFile.aged_from`),
    written as both being at or before it (no dialect's greatest/max needed)."""
    f = views.files.c
    return sa.and_(f.created_at <= cutoff, f.recorded_at <= cutoff)


def _verdict(facts: Mapping[Fact, ColumnElement[bool]]) -> Any:
    """The rule's verdict as a CASE over :data:`~state_runtime.retention.RULES` (each
    condition's facts in :class:`~state_runtime.retention.Fact`'s order, not the set's, so
    the rendered SQL, and the views compared with it at every open, is the same in every
    process)."""
    *conditional, (last, _) = rule.RULES
    return sa.case(
        *(
            (sa.and_(*(facts[fact] for fact in rule.Fact if fact in needs)), verdict.value)
            for verdict, needs in conditional
        ),
        else_=last.value,
    )


def verdicts(
    views: ReaderViews,
    policy: RetentionPolicy | PolicySql,
    scope: Scope,
    now: datetime | None = None,
    *,
    only_deletable: bool,
) -> sa.Select[Any]:
    """Every live or claimed file in scope with its verdict and the retained versions needing
    it (``needed_from``, ``needed_to``); or only the deletable files, which skips working out
    which versions need what (an anti-join is enough)."""
    if isinstance(policy, RetentionPolicy):
        if now is None:
            raise InvalidArgument("verdicts under a RetentionPolicy need the time they are for")
        policy = PolicySql.of(policy, now)
    retained = retained_bases(views, policy.offsets, scope)
    nf = needed_from(views, retained, scope).subquery("nf")
    floors = (
        sa.select(retained.c.store_id, sa.func.min(retained.c.base_version).label("floor"))
        .group_by(retained.c.store_id)
        .subquery("floors")
    )
    p = views.problems.c
    held = (
        sa.select(p.store_id)
        .where(p.resolved_at.is_(None), scope.filter(views, p.store_id))
        .distinct()
        .subquery("held")
    )
    is_held = held.c.store_id.is_not(None)
    f = views.files.c
    file_cols = file_columns(views.files, views.stores)
    if only_deletable:
        unknown = sa.null().cast(sa.BigInteger())
        facts = fact_sql(
            views, needed=sa.false(), floor=floors.c.floor, held=is_held, policy=policy
        )
        verdict = _verdict(facts)
        return (
            sa.select(
                *file_cols,
                verdict.label("verdict"),
                unknown.label("needed_from"),
                unknown.label("needed_to"),
                facts[Fact.ABOVE_FLOOR].label("above_floor"),
            )
            .join(views.stores, views.stores.c.store_id == f.store_id)
            .outerjoin(floors, floors.c.store_id == f.store_id)
            .outerjoin(held, held.c.store_id == f.store_id)
            .where(
                scope.filter(views, f.store_id),
                is_live(f),  # lets the live partial index serve
                # NOT IN, not NOT EXISTS: PostgreSQL hashes the page's needed files once,
                # where an anti-join planned from the CTE's low estimate compares every
                # live file with every needed one (quadratic in the page)
                f.file_id.not_in(sa.select(nf.c.file_id)),
                verdict.in_(sorted(v.value for v in rule.DELETABLE)),
            )
        )
    needed = (
        sa.select(
            nf.c.file_id,
            sa.func.min(nf.c.retained_version).label("needed_from"),
            sa.func.max(nf.c.retained_version).label("needed_to"),
        )
        .group_by(nf.c.file_id)
        .cte("needed")
    )
    facts = fact_sql(
        views,
        needed=needed.c.file_id.is_not(None),
        floor=floors.c.floor,
        held=is_held,
        policy=policy,
    )
    return (
        sa.select(
            *file_cols,
            _verdict(facts).label("verdict"),
            needed.c.needed_from,
            needed.c.needed_to,
            facts[Fact.ABOVE_FLOOR].label("above_floor"),
        )
        .select_from(views.files)
        .join(views.stores, views.stores.c.store_id == f.store_id)
        .outerjoin(needed, needed.c.file_id == f.file_id)
        .outerjoin(floors, floors.c.store_id == f.store_id)
        .outerjoin(held, held.c.store_id == f.store_id)
        .where(
            scope.filter(views, f.store_id),
            sa.or_(is_live(f), f.state == constant(FileState.DELETING)),
        )
    )


_VERDICTS = {verdict.value: verdict for verdict in Verdict}
_AFTER_FILE = len(FILE_COLUMNS)


def _file_verdict(row: AnyRow, policy: RetentionPolicy) -> FileVerdict:
    """A FileVerdict from a row of ``verdicts()``: FILE_COLUMNS, verdict, needed range, and
    whether the file lies at or above its store's floor."""
    record = file_record(row)
    claimed_by_run = row[_AFTER_FILE - 1]
    verdict_value, needed_from, needed_to, above_floor = row[_AFTER_FILE : _AFTER_FILE + 4]
    verdict = _VERDICTS[verdict_value]
    needed_by = None if needed_from is None else (needed_from, needed_to)
    text = rule.reason(
        verdict,
        policy,
        needed_by=needed_by,
        claimed_by_run=claimed_by_run,
        state_reason=record.state_reason,
        note=record.verification_note,
        above_floor=bool(above_floor),
    )
    return FileVerdict(record, verdict, text, needed_by, row.file_id)


@functools.cache
def _verdict_query(
    views: ReaderViews,
    dialect: str,
    retain_versions: int,
    shape: tuple[bool, bool],
    only_deletable: bool,
    by_path: bool,
    limited: bool,
    from_version: bool = False,
) -> sa.Select[Any]:
    """:func:`verdict_query`'s statement, built once per process, dialect and shape (building
    it costs more than running it): the cutoffs, and the scope's root (``root``) and store ids
    (``store_ids``), ``path``, ``from_version`` and ``limit`` are bind parameters
    (:func:`_verdict_values`)."""
    by_root, by_ids = shape
    scope = Scope(
        root=sa.bindparam("root", type_=views.stores.c.checkpoint_root.type) if by_root else None,
        store_ids="store_ids" if by_ids else None,
        dialect=dialect,
    )
    policy = PolicySql.bound(views, retain_versions)
    query = verdicts(views, policy, scope, only_deletable=only_deletable)
    f = views.files.c
    if by_path:
        query = query.where(f.path == sa.bindparam("path", type_=f.path.type))
    if from_version:  # a keyset: the live index's range from there, not the store's whole
        query = query.where(f.version >= sa.bindparam("from_version", type_=sa.BigInteger()))
    query = query.order_by(f.version, f.store_id, f.kind, f.file_id)
    return query.limit(sa.bindparam("limit", type_=sa.Integer())) if limited else query


def _verdict_values(scope: Scope) -> tuple[tuple[bool, bool], dict[str, Any]]:
    """The shape of ``scope`` (of values) and the values of its bind parameters."""
    values: dict[str, Any] = {}
    if scope.root is not None:
        values["root"] = scope.root
    if scope.store_ids is not None:
        if not isinstance(scope.store_ids, tuple):
            raise InvalidArgument("file verdicts are read for given store ids, not a query's")
        values["store_ids"] = list(scope.store_ids)
    return (scope.root is not None, scope.store_ids is not None), values


def verdict_query(
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
    *,
    dialect: str,
    only_deletable: bool,
    path: str | None = None,
    limit: int | None = None,
    from_version: int | None = None,
) -> tuple[sa.Select[Any], dict[str, Any]]:
    """The verdicts' statement for ``dialect`` (oldest versions first, none below
    ``from_version``; at most ``limit`` rows) and its values."""
    shape, values = _verdict_values(scope)
    query = _verdict_query(
        views,
        dialect,
        policy.retain_versions,
        shape,
        only_deletable,
        by_path=path is not None,
        limited=limit is not None,
        from_version=from_version is not None,
    )
    if from_version is not None:
        values["from_version"] = from_version
    values |= PolicySql.cutoffs(policy, now)
    if path is not None:
        values["path"] = path
    if limit is not None:
        values["limit"] = limit
    return query, values


def verdict_rows(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
    *,
    only_deletable: bool,
    path: str | None = None,
    limit: int | None = None,
    from_version: int | None = None,
) -> list[tuple[int, FileVerdict]]:
    asked: dict[str, Any] = {"path": path, "limit": limit, "from_version": from_version}
    asked["dialect"] = connection.dialect.name
    query, values = verdict_query(views, policy, scope, now, only_deletable=only_deletable, **asked)
    return [
        (row.file_id, _file_verdict(row, policy)) for row in connection.execute(query, values).all()
    ]


def file_verdicts(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
    *,
    only_deletable: bool = False,
) -> list[FileVerdict]:
    """The verdict on each live or claimed file in ``scope`` (or only the deletable ones)."""
    rows = verdict_rows(connection, views, policy, scope, now, only_deletable=only_deletable)
    return [verdict for _, verdict in rows]


@functools.cache
def _retained_queries(
    views: ReaderViews, dialect: str, retain_versions: int
) -> tuple[sa.Select[Any], sa.Select[Any], sa.Select[Any]]:
    """:func:`retained_versions`' statements (the files of each retained version, the
    retained commits, the idle commits) for the stores whose ids are the parameter
    ``store_ids`` (:class:`~state_runtime.catalog.sql.scope.Scope`); built once per process,
    dialect and shape (building costs more than running them; SQLAlchemy compiles each once
    per engine)."""
    in_page = Scope(store_ids="store_ids", dialect=dialect)
    nf = needed_files(views, retain_versions, in_page).subquery("nf")
    f, c, s = views.files.c, views.commits.c, views.stores.c
    files = (
        sa.select(*file_columns(views.files, views.stores), nf.c.retained_version)
        .select_from(nf)
        .join(views.files, f.file_id == nf.c.file_id)
        .join(views.stores, s.store_id == f.store_id)
        .order_by(nf.c.retained_version.desc(), f.version)
    )
    retained = (
        sa.select(c.store_id, c.version, c.checkpoint_id)
        .join(views.stores, s.store_id == c.store_id)
        .where(
            in_page.filter(views, c.store_id),
            # the versions retained_bases retains: none above the latest (a store a
            # repartition dropped has latest 0 and keeps its old commits: it retains none)
            c.version <= s.latest_version,
            c.version > s.latest_version - retain_versions,
            c.version > s.expired_through,
        )
        .order_by(c.store_id, c.version.desc())
    )
    idle = sa.select(c.store_id, c.version).where(
        in_page.filter(views, c.store_id), c.file_id.is_(None)
    )
    return files, retained, idle


def retained_versions(
    connection: Connection,
    views: ReaderViews,
    root: str,
    stores: Iterable[StoreId],
    retain_versions: int,
) -> dict[StoreId, list[RetainedVersion]]:
    """Each store's retained committed versions, newest first, each with the files that load
    it (a store the catalog does not know has none); three statements for all the stores."""
    wanted = list(stores)
    result: dict[StoreId, list[RetainedVersion]] = {store: [] for store in wanted}
    ids = store_ids(connection, views, root, wanted)
    if not ids:
        return result
    store_of = {store_id: store for store, store_id in ids.items()}
    queries = _retained_queries(views, connection.dialect.name, retain_versions)
    files_query, retained_query, idle_query = queries
    values = {"store_ids": sorted(store_of)}
    files: dict[tuple[int, int], list[FileRecord]] = {}
    records: dict[int, FileRecord] = {}  # by file id: a file loads several retained versions
    for row in connection.execute(files_query, values):
        record = records.get(row.file_id)
        if record is None:
            record = records[row.file_id] = file_record(row)
        files.setdefault((row.store_id, row.retained_version), []).append(record)
    idle: dict[int, set[int]] = {}
    for row in connection.execute(idle_query, values):
        idle.setdefault(row.store_id, set()).add(row.version)
    for entry in connection.execute(retained_query, values):
        store = store_of[entry.store_id]
        chain, complete = _chain(
            files.get((entry.store_id, entry.version), []),
            entry.version,
            frozenset(idle.get(entry.store_id, ())),
        )
        ref = CheckpointRef(entry.version, entry.checkpoint_id)
        result[store].append(RetainedVersion(StoreKey(root, store), ref, tuple(chain), complete))
    return result


def _chain(
    files: list[FileRecord], version: int, idle: frozenset[int]
) -> tuple[list[FileRecord], bool]:
    """The files the loader reads for ``version``, oldest first, and whether they reach a
    snapshot or version 1: walk down from ``version`` (a snapshot ends the walk; a version
    that changed nothing is its parent's state) and stop at the first other version without
    a live file, as the loader would."""
    at: dict[int, FileRecord] = {}
    for record in files:
        if record.kind is FileKind.SNAPSHOT or record.version not in at:
            at[record.version] = record
    chain: list[FileRecord] = []
    for current in range(version, 0, -1):
        found = at.get(current)
        if found is None and current in idle:
            continue
        if found is None:
            return chain[::-1], False
        chain.append(found)
        if found.kind is FileKind.SNAPSHOT:
            break
    return chain[::-1], True
