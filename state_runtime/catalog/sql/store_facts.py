"""Each store's facts as one selectable: what ``store_health`` reads and what the view
``state_store_facts`` is.

The status rule (:mod:`state_runtime.status`) is derived from these facts, in Python from the
rows this query returns and in SQL from the view compiled from it
(:mod:`~state_runtime.catalog.sql.status`). The conditions on files come from
:mod:`~state_runtime.catalog.schema.predicates`; "reclaimable" is what cleanup may delete now under
the policy, the retention rule's own verdict (``sql/retention.py``: ``verdicts``).
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa

from state_runtime.catalog.schema.predicates import is_live, is_orphan, is_verified_snapshot_by_row
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import RunKind
from state_runtime.catalog.sql.retention import PolicySql, verdicts
from state_runtime.catalog.sql.scope import AmongFound, Scope


def last_snapshots(views: ReaderViews, scope: Scope) -> sa.Subquery:
    """Per store, the newest verified committed snapshot's version (an unverified snapshot
    replaces nothing yet).

    A snapshot is committed when the commit log names its (version, id); each store's
    committed versions form one linear chain, so that snapshot lies on the latest version's
    lineage.
    """
    f = views.files.c
    return (
        sa.select(
            f.store_id,
            sa.func.max(f.version).label("snapshot_version"),
            sa.func.max(f.created_at).label("snapshot_at"),
        )
        .where(is_verified_snapshot_by_row(f), scope.filter(views, f.store_id))
        .group_by(f.store_id)
        .subquery("last_snapshot")
    )


def _loadable_versions(views: ReaderViews, scope: Scope) -> sa.Subquery:
    """Per store, how many committed versions still load from the files kept: version ``v``
    loads when no committed delta at or below it is gone, or a verified committed snapshot
    lies between the newest gone one and ``v`` (the loader's walk, counted in SQL)."""
    c, f = views.commits.c, views.files.c
    gone = sa.case((~is_live(f), c.version), else_=0)
    steps = (
        sa.select(
            c.store_id,
            c.version,
            sa.func.max(gone)
            .over(partition_by=c.store_id, order_by=c.version, rows=(None, 0))
            .label("gone_below"),
        )
        .outerjoin(
            views.files, f.file_id == c.file_id
        )  # none: changed nothing, loads as its parent
        .where(scope.filter(views, c.store_id))
        .subquery("steps")
    )
    snap = views.files.alias("base")
    bridged = (
        sa.select(snap.c.file_id)
        .where(
            snap.c.store_id == steps.c.store_id,
            snap.c.version >= steps.c.gone_below,
            snap.c.version <= steps.c.version,
            is_verified_snapshot_by_row(snap.c),
        )
        .exists()
    )
    return (
        sa.select(steps.c.store_id, sa.func.count().label("versions"))
        .where(sa.or_(steps.c.gone_below == 0, bridged))
        .group_by(steps.c.store_id)
        .subquery("loadable")
    )


def _live_files(views: ReaderViews, scope: Scope) -> sa.Subquery:
    """Per store: live files and bytes, the orphans among them and the oldest orphan."""
    f = views.files.c
    orphan = is_orphan(f)
    return (
        sa.select(
            f.store_id,
            sa.func.count().label("files"),
            sa.func.sum(f.size_bytes).label("bytes"),
            sa.func.sum(sa.case((orphan, 1), else_=0)).label("orphan_files"),
            sa.func.sum(sa.case((orphan, f.size_bytes), else_=0)).label("orphan_bytes"),
            sa.func.min(sa.case((orphan, f.state_changed_at), else_=None)).label("oldest_orphan"),
        )
        .where(is_live(f), scope.filter(views, f.store_id))
        .group_by(f.store_id)
        .subquery("live")
    )


def _reclaimable(views: ReaderViews, policy: PolicySql, scope: Scope) -> sa.Subquery:
    """Per store, the files and bytes cleanup under ``policy`` may delete now."""
    deletable = verdicts(views, policy, scope, only_deletable=True).subquery("deletable")
    return (
        sa.select(
            deletable.c.store_id,
            sa.func.count().label("files"),
            sa.func.sum(deletable.c.size_bytes).label("bytes"),
        )
        .group_by(deletable.c.store_id)
        .subquery("reclaim")
    )


def _problems(views: ReaderViews, scope: Scope) -> sa.Subquery:
    """Per store: open problems, since when, and when a problem was last resolved (by anything,
    and by a restore: a restore is not a validation)."""
    p = views.problems.c
    is_open = p.resolved_at.is_(None)
    restores = sa.select(views.runs.c.run_id).where(views.runs.c.kind == RunKind.RESTORE.value)
    by_restore = p.resolved_by_run.in_(restores.scalar_subquery())
    return (
        sa.select(
            p.store_id,
            sa.func.sum(sa.case((is_open, 1), else_=0)).label("open"),
            sa.func.min(sa.case((is_open, p.detected_at), else_=None)).label("since"),
            sa.func.max(p.resolved_at).label("last_resolved_at"),
            sa.func.max(sa.case((by_restore, p.resolved_at), else_=None)).label("last_restored_at"),
        )
        .where(scope.filter(views, p.store_id))
        .group_by(p.store_id)
        .subquery("problems")
    )


def _first_problem(views: ReaderViews, store_id: Any) -> sa.ScalarSelect[Any]:
    """The oldest open problem of the store, naming its file (as ``problem_text`` words it)
    unless its text already does (a damaged file's paragraph names it)."""
    q = views.problems.alias("first_problem")
    named = sa.literal(" (file ", sa.Text()).concat(sa.func.nullif(q.c.path, "")).concat(")")
    names_it = sa.func.replace(q.c.problem, q.c.path, "") != q.c.problem  # exact, both dialects
    said = sa.case((names_it, ""), else_=sa.func.coalesce(named, ""))
    return (
        sa.select(q.c.problem.concat(said))
        .where(q.c.store_id == store_id, q.c.resolved_at.is_(None))
        .order_by(q.c.detected_at, q.c.problem_id)
        .limit(1)
        .scalar_subquery()
    )


def last_status_changes(views: ReaderViews, scope: Scope) -> sa.Subquery:
    """Per store, its last recorded status change (status, changed_at)."""
    ch = views.status_changes.c
    newest = (
        sa.select(ch.store_id, sa.func.max(ch.change_id).label("change_id"))
        .where(scope.filter(views, ch.store_id))
        .group_by(ch.store_id)
        .subquery("newest_change")
    )
    return (
        sa.select(ch.store_id, ch.status, ch.changed_at)
        .join(newest, newest.c.change_id == ch.change_id)
        .subquery("last_change")
    )


def store_facts(
    views: ReaderViews, policy: PolicySql, scope: Scope, *, figures: bool = True
) -> sa.Select[Any]:
    """One row per store in ``scope``: its name, latest version, snapshot chain, files,
    reclaimable files under ``policy``, problems, validations, last maintenance run and last
    recorded status change. ``figures=False`` leaves out the facts no status reads (the
    loadable versions and the reclaimable files, the costliest parts): what recording the
    status changes needs."""
    s, r = views.stores.c, views.runs.c
    live, reclaim = _live_files(views, scope), _reclaimable(views, policy, scope)
    problems, changed = _problems(views, scope), last_status_changes(views, scope)
    snap, loadable = last_snapshots(views, scope), _loadable_versions(views, scope)
    figure = functools.partial(_figure, figures)
    in_scope = views.stores.alias("in_scope")
    newest = (  # the roots of the stores in scope only: all stores' was a scan in every page
        sa.select(s.checkpoint_root, sa.func.max(s.latest_version).label("version"))
        .where(
            AmongFound(
                s.checkpoint_root,
                sa.select(in_scope.c.checkpoint_root)
                .distinct()
                .where(scope.filter(views, in_scope.c.store_id)),
            )
        )
        .group_by(s.checkpoint_root)
        .subquery("newest")
    )
    latest_commit, chain = views.commits.alias("latest_commit"), views.commits.alias("chain")
    latest_file = views.files.alias("latest_file")
    snapshot_version = sa.func.coalesce(snap.c.snapshot_version, 0)
    open_problems = sa.func.coalesce(problems.c.open, 0)
    facts = (
        sa.select(
            s.store_id,
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
            s.created_at,
            s.latest_version,
            s.latest_checkpoint_id,
            s.last_committed_at,
            (newest.c.version - s.latest_version).label("versions_behind"),
            snapshot_version.label("last_snapshot_version"),
            snap.c.snapshot_at.label("last_snapshot_at"),
            (s.latest_version - snapshot_version).label("deltas_since_snapshot"),
            chain.c.committed_at.label("chain_since"),
            *figure(sa.func.coalesce(loadable.c.versions, 0).label("versions_loadable")),
            sa.func.coalesce(latest_file.c.rows, 0).label("state_rows"),
            sa.func.coalesce(live.c.files, 0).label("live_files"),
            sa.func.coalesce(live.c.bytes, 0).label("live_bytes"),
            sa.func.coalesce(live.c.orphan_files, 0).label("orphan_files"),
            sa.func.coalesce(live.c.orphan_bytes, 0).label("orphan_bytes"),
            live.c.oldest_orphan.label("oldest_orphan_at"),
            *figure(sa.func.coalesce(reclaim.c.files, 0).label("reclaimable_files")),
            *figure(sa.func.coalesce(reclaim.c.bytes, 0).label("reclaimable_bytes")),
            open_problems.label("open_problems"),
            sa.case((open_problems > 0, _first_problem(views, s.store_id))).label("first_problem"),
            problems.c.since.label("problems_since"),
            problems.c.last_resolved_at,
            problems.c.last_restored_at,
            s.first_validated_at,
            s.last_validated_at,
            s.last_run_id,
            r.kind.label("last_run_kind"),
            r.outcome.label("last_run_outcome"),
            r.ended_at.label("last_run_ended_at"),
            changed.c.status.label("recorded_status"),
            changed.c.changed_at.label("status_changed_at"),
        )
        .select_from(views.stores)
        .join(newest, newest.c.checkpoint_root == s.checkpoint_root)
        .outerjoin(snap, snap.c.store_id == s.store_id)
    )
    if figures:
        facts = facts.outerjoin(loadable, loadable.c.store_id == s.store_id)
    facts = facts.outerjoin(
        latest_commit,
        sa.and_(
            latest_commit.c.store_id == s.store_id,
            latest_commit.c.version == s.latest_version,
        ),
    )
    facts = facts.outerjoin(latest_file, latest_file.c.file_id == latest_commit.c.file_id)
    facts = facts.outerjoin(live, live.c.store_id == s.store_id)
    if figures:
        facts = facts.outerjoin(reclaim, reclaim.c.store_id == s.store_id)
    return (
        facts.outerjoin(views.runs, r.run_id == s.last_run_id)
        .outerjoin(
            chain,
            sa.and_(chain.c.store_id == s.store_id, chain.c.version == snapshot_version + 1),
        )
        .outerjoin(problems, problems.c.store_id == s.store_id)
        .outerjoin(changed, changed.c.store_id == s.store_id)
        .where(scope.filter(views, s.store_id))
    )


def _figure(wanted: bool, column: sa.ColumnElement[Any]) -> tuple[sa.ColumnElement[Any], ...]:
    """``column``, or nothing when the figures are left out (``store_facts``)."""
    return (column,) if wanted else ()
