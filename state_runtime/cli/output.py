"""What the CLI prints: rich tables and summaries of maintenance reports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from state_runtime.catalog import (
    Layout,
    RecordedBatchMetrics,
    VersionHistory,
)
from state_runtime.cli.jsonable import jsonable
from state_runtime.maintenance import (
    ChecksReport,
    CleanupReport,
    Damage,
    DamageReport,
    DueStore,
    FileExplanation,
    LeftoverReport,
    ReconcileReport,
    RelocationReport,
    RepairReport,
    RestorePlan,
    SchemaChangeRow,
    SchemaCheck,
    SnapshotReport,
    Status,
    StoreReport,
    StoreStatus,
)
from state_runtime.units import age, millis, size

if TYPE_CHECKING:
    from state_runtime.maintenance.repartition import RepartitionPlan

SHOWN = 20  # rows of detail before "... and N more"


def show(console: Console, table: Table) -> None:
    """Print a table, never cutting a value, at any width (``COLUMNS``, a terminal): when
    every figure fits whole and every word of text fits its column, as a table (a path too
    long for its column folds onto the next line); when the width cannot hold that (80
    columns, a dozen columns), one block per row, a ``column: value`` line each, like psql's
    expanded display."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    if _narrowest(table) <= console.width:
        console.print(table)
        return
    headers = [str(column.header) for column in table.columns]
    width = max(len(h) for h in headers)
    if table.title:
        console.print(str(table.title))
    for row in range(table.row_count):
        console.print()
        for header, column in zip(headers, table.columns, strict=True):
            console.print(f"{header:>{width}}: {list(column.cells)[row]}")
    if table.caption:
        console.print(f"\n{table.caption}")


def _narrowest(table: Table) -> int:
    """The width a table needs with whole figures and whole words of text."""
    needed = 1
    for column in table.columns:
        cells = [Text.from_markup(str(c)).plain for c in (column.header, *column.cells)]
        if column.justify == "right":
            needed += max(len(c) for c in cells) + 3
        else:
            needed += min(max(len(w) for c in cells for w in c.split() or [""]), 24) + 3
    return needed


def root_prefix(roots: Collection[str]) -> str:
    """What to print once above rows of stores: the root when there is one, else the folder
    the roots share (empty if none); each row then shows only the rest (:func:`below`)."""
    unique = sorted(set(roots))
    if len(unique) == 1:
        return unique[0]
    first, last = (unique[0], unique[-1]) if unique else ("", "")
    shared = 0
    while shared < min(len(first), len(last)) and first[shared] == last[shared]:
        shared += 1
    return first[: first.rfind("/", 0, shared) + 1] if shared else ""


def below(prefix: str, root: str, rest: str = "") -> str:
    """A root (and what follows it, ``#store``) as a row shows it below ``prefix``."""
    if root == prefix:
        return rest.removeprefix("#") or "."
    return root.removeprefix(prefix) + rest


def print_prefix(console: Console, prefix: str, roots: Collection[str]) -> None:
    """``root: <root>`` on one line when it fits the width; else the label, then the root on
    lines of its own, folded at the width (``COLUMNS``, a terminal; never on a pipe without
    ``COLUMNS``)."""
    if prefix:
        label = "root" if len(set(roots)) == 1 else "roots below"
        line = f"{label}: {prefix}"
        if len(line) <= console.width:
            console.print(line, markup=False)
        else:
            console.print(f"{label}:")
            console.print(prefix, markup=False, overflow="fold")


def print_health(console: Console, reports: Sequence[StoreReport]) -> None:
    """One row per store; the root (or the folder the roots share) is printed once above the
    table, each row shows the rest."""
    roots = {r.key.root for r in reports}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    title = f"State store health ({len(reports)} stores)"
    table = Table(
        title=title,
        caption="deltas: since the last verified snapshot; recovery: bytes a cold load of the "
        "latest reads",
    )
    table.add_column("store", no_wrap=True)
    table.add_column("status")
    table.add_column("why")
    for name in (
        "version",
        "lag",
        "deltas",
        "recovery",
        "rows",
        "live",
        "orphans",
        "reclaimable",
        "last run",
    ):
        table.add_column(name, justify="right")
    for r in reports:
        h = r.health
        run = f"{h.last_run_kind} {h.last_run_outcome}" if h.last_run_kind else "-"
        table.add_row(
            below(prefix, h.key.root, f"#{h.key.store}"),
            status_label(r.status),
            r.status.reason,
            str(h.latest.version),
            age(h.commit_lag),
            str(h.deltas_since_snapshot),
            size(r.recovery.bytes),
            f"{h.state_rows:,}",
            size(h.live_bytes),
            str(h.orphan_files),
            size(h.reclaimable_bytes),
            run,
        )
    show(console, table)


_COLOURS = {
    StoreStatus.HEALTHY: "green",
    StoreStatus.DEGRADED: "yellow",
    StoreStatus.BROKEN: "red",
    StoreStatus.UNKNOWN: "dim",
}


def status_label(status: Status) -> str:
    """The status, coloured, with since when."""
    since = "" if status.since is None else f" since {status.since:%Y-%m-%d %H:%M}"
    colour = _COLOURS[status.status]
    return f"[{colour}]{status.status.value}[/{colour}]{since}"


_SEVERITY = {
    StoreStatus.BROKEN: 0,
    StoreStatus.DEGRADED: 1,
    StoreStatus.UNKNOWN: 2,
    StoreStatus.HEALTHY: 3,
}

_SORT_KEYS = {
    "store": lambda r: (0, str(r.key)),
    "status": lambda r: (_SEVERITY[r.status.status], str(r.key)),
    "deltas": lambda r: (-r.health.deltas_since_snapshot, str(r.key)),
    "recovery": lambda r: (-r.recovery.bytes, str(r.key)),
    "reclaimable": lambda r: (-r.health.reclaimable_bytes, str(r.key)),
    "orphans": lambda r: (-r.health.orphan_bytes, str(r.key)),
    "lag": lambda r: (-(r.health.commit_lag or timedelta(0)).total_seconds(), str(r.key)),
}


def sorted_reports(reports: Sequence[StoreReport], by: str) -> list[StoreReport]:
    return sorted(reports, key=_SORT_KEYS[by])


def health_json(report: StoreReport) -> dict[str, Any]:
    """One store's health for ``--json``: status, figures, the last snapshot, the last run,
    validation and problems (every fact the table shows, and those it leaves out)."""
    h = report.health
    return (
        {"store": str(report.key), "root": h.key.root, "name": str(h.key.store)}
        | report.status_fields()
        | report.figures()
        | {
            "latest_checkpoint_id": h.latest.checkpoint_id,
            "last_committed_at": jsonable(h.last_committed_at),
            "last_snapshot": {
                "version": h.last_snapshot_version,
                "written_at": jsonable(h.last_snapshot_at),
                "deltas_since": h.deltas_since_snapshot,
                "chain_since": jsonable(h.chain_since),
            },
            "last_run": None
            if h.last_run_id is None
            else {
                "run_id": h.last_run_id,
                "kind": h.last_run_kind,
                "outcome": h.last_run_outcome,
                "ended_at": jsonable(h.last_run_ended_at),
            },
            "first_validated_at": jsonable(h.first_validated_at),
            "last_validated_at": jsonable(h.last_validated_at),
            "first_problem": h.first_problem,
            "problems_since": jsonable(h.problems_since),
        }
    )


def print_history(console: Console, entries: Sequence[VersionHistory]) -> None:
    """One line per committed version, newest first, then each version's later events."""
    roots = {e.key.root for e in entries}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    table = Table(title=f"History ({len(entries)} committed versions, newest first)")
    for name in ("store", "version", "batch", "query", "checkpoint id", "committed"):
        table.add_column(name)
    for name in ("rows", "bytes", "files", "snapshots", "deleted"):
        table.add_column(name, justify="right")
    for e in entries:
        table.add_row(
            below(prefix, e.key.root, f"#{e.key.store}"),
            str(e.ref.version),
            str(e.batch_id),
            e.query_id,
            e.ref.checkpoint_id or "-",
            f"{e.committed_at:%Y-%m-%d %H:%M:%S}",
            f"{e.rows:,}",
            size(e.bytes_written),
            str(len(e.files)),
            ", ".join(f"{s.verification}" for s in e.snapshots) or "-",
            str(len(e.deleted)) or "-",
        )
    show(console, table)
    for e in entries:
        shown = below(prefix, e.key.root, f"#{e.key.store}")
        for f in e.files:
            if f.kind.value == "snapshot":
                console.print(
                    f"  {shown} v{e.ref.version}: snapshot {f.path} written "
                    f"{f.created_at:%Y-%m-%d %H:%M:%S}, {size(f.size_bytes)}, {f.verification}"
                )
            if f.deleted_at is not None:
                console.print(
                    f"  {shown} v{e.ref.version}: deleted {f.path} at "
                    f"{f.deleted_at:%Y-%m-%d %H:%M:%S} by run {f.deletion_run}: "
                    f"{f.deletion_reason}"
                )


def newest_batches(entries: Sequence[VersionHistory], limit: int) -> list[VersionHistory]:
    """The versions of the ``limit`` newest micro-batches among ``entries`` (newest first,
    as the catalog returns them: a batch's versions share its commit time), whole."""
    kept: set[tuple[str, int]] = set()
    chosen = []
    for e in entries:
        batch = (e.query_id, e.batch_id)
        if batch not in kept:
            if len(kept) == limit:
                continue
            kept.add(batch)
        chosen.append(e)
    return chosen


def batch_history(entries: Sequence[VersionHistory]) -> list[dict[str, Any]]:
    """The versions grouped by (root, query, batch), newest batch first: one micro-batch
    and all its stores per entry."""
    groups: dict[tuple[str, str, int], list[VersionHistory]] = {}
    for e in entries:
        groups.setdefault((e.key.root, e.query_id, e.batch_id), []).append(e)
    return [
        {
            "root": root,
            "query_id": query,
            "batch_id": batch,
            "committed_at": jsonable(max(e.committed_at for e in group)),
            "stores": len(group),
            "versions": sorted({e.ref.version for e in group}),
            "rows": sum(e.rows for e in group),
            "bytes_written": sum(e.bytes_written for e in group),
            "files": sum(len(e.files) for e in group),
            "snapshots": sum(len(e.snapshots) for e in group),
            "deleted_files": sum(len(e.deleted) for e in group),
        }
        for (root, query, batch), group in sorted(
            groups.items(), key=lambda item: (item[0][0], item[0][1], -item[0][2])
        )
    ]


def print_batch_history(console: Console, batches: Sequence[dict[str, Any]]) -> None:
    roots = {b["root"] for b in batches}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    table = Table(title=f"History ({len(batches)} micro-batches, newest first)")
    for name in ("root", "query", "batch", "committed", "stores", "versions"):
        table.add_column(name)
    for name in ("rows", "bytes", "files", "snapshots", "deleted"):
        table.add_column(name, justify="right")
    for b in batches:
        versions = b["versions"]
        table.add_row(
            below(prefix, b["root"]),
            b["query_id"],
            str(b["batch_id"]),
            b["committed_at"],
            str(b["stores"]),
            str(versions[0]) if len(versions) == 1 else f"{versions[0]}..{versions[-1]}",
            f"{b['rows']:,}",
            size(b["bytes_written"]),
            str(b["files"]),
            str(b["snapshots"]),
            str(b["deleted_files"]),
        )
    show(console, table)


def print_due_snapshots(console: Console, due: Sequence[DueStore]) -> None:
    console.print(f"snapshots (dry run): {len(due)} store(s) due")
    for store in due[:SHOWN]:
        console.print(
            f"  {store.record.key}: {store.deltas_since_snapshot} deltas since the last snapshot"
        )
    if len(due) > SHOWN:
        console.print(f"  ... and {len(due) - SHOWN} more")


def print_snapshots(console: Console, report: SnapshotReport) -> None:
    c = report.counts()
    console.print(
        f"snapshots (run {report.run_id}): {c['written']} written ({size(c['bytes_written'])}), "
        f"{c['recorded']} recorded, {c['up_to_date']} up to date, {c['busy']} busy, "
        f"{c['failed']} failed"
    )
    for outcome in report.failed[:SHOWN]:
        console.print(f"  [red]failed[/red] {outcome.key}: {outcome.error}")


def _print_held(console: Console, report: CleanupReport) -> None:
    if not report.held:
        return
    console.print(
        f"held: {len(report.held)} store(s) with open validation problems; nothing they "
        "committed is deleted until a validation passes or `statestore resolve`"
    )
    for held in report.held[:SHOWN]:
        console.print(
            f"  {held.key}: since {held.since:%Y-%m-%d %H:%M:%S}, {held.problems} problem(s); "
            f"{held.reason}"
        )
    if len(report.held) > SHOWN:
        console.print(f"  ... and {len(report.held) - SHOWN} more")


def print_cleanup(console: Console, report: CleanupReport) -> None:
    _print_held(console, report)
    reasons = Counter(v.verdict.value for v in report.planned)
    breakdown = ", ".join(f"{n} {verdict}" for verdict, n in sorted(reasons.items()))
    if report.dry_run:
        console.print(
            f"cleanup (dry run): would delete {len(report.planned)} files, "
            f"{size(report.planned_bytes)}" + (f" ({breakdown})" if breakdown else "")
        )
        for verdict in report.planned[:SHOWN]:
            console.print(f"  {verdict.file.key.root}/{verdict.file.path}: {verdict.reason}")
        if len(report.planned) > SHOWN:
            console.print(f"  ... and {len(report.planned) - SHOWN} more")
        print_leftovers(console, report.leftovers, dry_run=True)
        if report.planned or report.leftovers.removed:
            console.print("Run with --execute to delete them.")
        return
    console.print(
        f"cleanup (run {report.run_id}): deleted {len(report.deleted)} files, "
        f"{size(report.deleted_bytes)}; {len(report.failed)} failed; "
        f"{len(report.busy)} stores busy (leased by another run)"
    )
    for path, error in list(report.failed.items())[:SHOWN]:
        console.print(f"  [red]failed[/red] {path}: {error}")
    print_leftovers(console, report.leftovers, dry_run=False)


def print_leftovers(console: Console, report: LeftoverReport, *, dry_run: bool) -> None:
    """Unfinished writes of killed writers, if any were found."""
    if not report.found:
        return
    verb = "would remove" if dry_run else "removed"
    console.print(
        f"unfinished writes (temporary files, incomplete uploads): {len(report.found)} found, "
        f"{verb} {len(report.removed)}, {len(report.young)} too young (maybe still running), "
        f"{len(report.failed)} failed"
    )
    for path in report.removed[:SHOWN]:
        console.print(f"  {verb} {path}")
    for path, error in list(report.failed.items())[:SHOWN]:
        console.print(f"  [red]failed[/red] {path}: {error}")


def print_checks(console: Console, report: ChecksReport) -> None:
    table = Table(title=f"Validation (run {report.run_id})")
    for name in ("check", "result", "summary"):
        table.add_column(name)
    for o in report.outcomes:
        result = (
            "[green]passed[/green]"
            if o.passed
            else ("[red]ERROR[/red]" if o.severity.value == "error" else "[yellow]WARN[/yellow]")
        )
        table.add_row(o.name.value, result, o.summary)
    show(console, table)
    for o in report.outcomes:
        for finding in o.findings[:SHOWN]:
            console.print(f"  {finding.severity.value}: {finding}", soft_wrap=True)
        if len(o.findings) > SHOWN:
            console.print(f"  ... and {len(o.findings) - SHOWN} more ({o.name.value})")


def print_reconcile(console: Console, report: ReconcileReport) -> None:
    c = report.counts()
    verb = "would record" if report.dry_run else "recorded"
    console.print(
        f"reconcile (run {report.run_id}): listed {c['listed']} files; {c['untracked']} unknown "
        f"to the catalog, {verb} {c['untracked'] - c['in_flight'] - c['unreadable']}; "
        f"{c['in_flight']} too young (maybe in flight), {c['unreadable']} unreadable, "
        f"{c['foreign']} not checkpoint files (left alone), {c['resurrected']} recorded "
        "deleted but present"
    )
    for path, state in list(report.recorded.items())[:SHOWN]:
        console.print(f"  recorded {path} as {state}")
    for path, error in list(report.unreadable.items())[:SHOWN]:
        console.print(f"  [red]unreadable[/red] {path}: {error}")
    print_leftovers(console, report.leftovers, dry_run=report.dry_run)


def print_relocation(console: Console, report: RelocationReport) -> None:
    found = report.files_checked - len(report.missing)
    console.print(
        f"relocate {report.old} -> {report.new}: {found} of {report.files_checked} committed "
        "file(s) found at the new root"
    )
    for path in report.missing[:SHOWN]:
        console.print(f"  [red]missing[/red] {path}")
    if len(report.missing) > SHOWN:
        console.print(f"  ... and {len(report.missing) - SHOWN} more")
    if report.executed:
        console.print(f"{report.stores_moved} store(s) now recorded below {report.new}")
    elif not report.missing:
        console.print("Run with --execute to record the new root.")


def print_damaged(console: Console, rebuild: Sequence[Damage]) -> None:
    """A repair's dry run: each damaged snapshot it rebuilds, one paragraph each."""
    if rebuild:
        console.print(f"repair (dry run): {len(rebuild)} damaged snapshot(s) to rebuild")
    for damage in rebuild[:SHOWN]:
        console.print(damage.paragraph(), soft_wrap=True, markup=False)
    if len(rebuild) > SHOWN:
        console.print(f"... and {len(rebuild) - SHOWN} more")


def print_beyond_repair(console: Console, left: DamageReport) -> None:
    """What repair cannot fix: each damaged file with its fate and next command, then the
    problems that name no damaged file."""
    for damage in left.damages[:SHOWN]:
        console.print(f"cannot repair: {damage.paragraph()}", soft_wrap=True, markup=False)
    for p in left.other[:SHOWN]:
        where = f" (file {p.path})" if p.path else ""
        console.print(
            f"cannot repair: store {p.key}: {p.problem}{where}; repair rebuilds only damaged "
            "snapshots: `statestore restore` returns the query to an intact batch (its dry run "
            "names the newest one)",
            soft_wrap=True,
            markup=False,
        )
    hidden = max(len(left.damages) - SHOWN, 0) + max(len(left.other) - SHOWN, 0)
    if hidden:
        console.print(f"... and {hidden} more")


def print_repairs(console: Console, report: RepairReport) -> None:
    c = report.counts()
    console.print(
        f"repair (run {report.run_id}): {c['repaired']} repaired, {c['adopted']} adopted, "
        f"{c['intact']} intact, {c['unrepairable']} unrepairable, {c['busy']} busy, "
        f"{c['failed']} failed"
    )
    for outcome in report.outcomes[:SHOWN]:
        colour = "red" if outcome in report.failed else "green"
        console.print(
            f"  [{colour}]{outcome.status.value}[/{colour}] {outcome.key.root}/{outcome.path}: "
            f"{outcome.detail}"
        )


def print_explanation(console: Console, explained: FileExplanation) -> None:
    e = explained.explanation
    console.print(f"[bold]{e.root}/{e.path}[/bold]")
    console.print(f"verdict: {e.verdict.value}")
    console.print(f"why: {e.reason}")
    if e.file is not None:
        f = e.file
        console.print(
            f"file: {f.kind.value} of store {f.key.store}, version {f.version}, checkpoint id "
            f"{f.checkpoint_id}, {size(f.size_bytes)}, {f.file_rows} rows in the file, state "
            f"{f.state}, written {f.created_at.isoformat()} (writer's clock), recorded "
            f"{f.recorded_at.isoformat()} (its age counts from the later)"
        )
    if e.needed_by is not None and e.verdict.value == "needed":
        lo, hi = e.needed_by
        console.print(f"needed by retained versions {lo}..{hi}")
    if explained.status is not None:  # a damaged file's advice below says what its reason says
        why = "" if explained.damage else f": {explained.status.reason}"
        console.print(f"store status: {status_label(explained.status)}{why}")
    if explained.damage is not None:
        console.print(f"next: {explained.damage.advice}", soft_wrap=True, markup=False)


def checks_json(report: ChecksReport) -> dict[str, Any]:
    return {
        "run_id": report.run_id,
        "ok": report.ok,
        "checks": [
            {
                "name": o.name.value,
                "passed": o.passed,
                "severity": o.severity.value,
                "summary": o.summary,
                "figures": dict(o.figures),
                "findings": [
                    {
                        "store": str(f.key),
                        "severity": f.severity.value,
                        "problem": f.problem,
                        "path": f.path,
                        "version": f.version,
                        "fate": None if f.damage is None else f.damage.fate.value,
                        "command": None if f.damage is None else f.damage.command,
                    }
                    for f in o.findings
                ],
            }
            for o in report.outcomes
        ],
    }


def print_schema_changes(console: Console, rows: Sequence[SchemaChangeRow]) -> None:
    """One line per schema of each operator store, oldest first, with what changed."""
    table = Table(title=f"Schema history ({len(rows)} schemas)")
    for name in ("root", "operator", "store", "from batch", "schema id", "key", "value", "change"):
        table.add_column(name, no_wrap=name in ("schema id", "from batch"))
    for r in rows:
        table.add_row(
            r.root,
            str(r.operator_id),
            r.store_name,
            str(r.from_batch),
            r.schema_id[:12],
            r.key_schema,
            r.value_schema,
            "; ".join(r.actions),
        )
    show(console, table)


def print_schema_check(console: Console, check: SchemaCheck) -> None:
    """The verdict on a planned schema change, and what it does or why it is refused."""
    what = f"operator {check.operator_id} (store {check.store_name}) of query {check.query_id}"
    console.print(f"{what}\n  recorded: {check.current}\n  proposed: {check.proposed}")
    if not check.allowed:
        console.print(f"[red]refused[/red]: {check.reason}", markup=True, highlight=False)
        return
    console.print(f"[green]allowed[/green] from batch {check.from_batch}:", markup=True)
    for action in check.actions:
        console.print(f"  - {action}", highlight=False)


def print_restore(console: Console, plan: RestorePlan) -> None:
    """What a restore did, or (a dry run) will do."""
    done = plan.executed
    head = f"restore (run {plan.run_id})" if done else "restore (dry run: --execute to restore)"
    console.print(
        f"{head}: query {plan.query_id} below {plan.root} "
        f"{'returned' if done else 'returns'} to batch {plan.batch_id} "
        f"(last committed batch was {plan.last_batch}); {len(plan.targets)} store(s)",
        soft_wrap=True,
    )
    batches = sorted({e.batch_id for e in plan.superseded if e.batch_id > plan.batch_id})
    if batches:
        console.print(
            f"  superseded: batch(es) {batches[0]}-{batches[-1]}, "
            f"{len(plan.superseded)} committed version(s); their files become orphans that "
            "cleanup deletes after the grace period (the ledger names this restore)",
            soft_wrap=True,
        )
    for lost in plan.lost:
        console.print(
            f"  lost, starts again from empty (--allow-lost-state): {lost.key} "
            f"version {lost.version}: {lost.problem}",
            soft_wrap=True,
        )
    if plan.spark is None:
        console.print("  Spark checkpoint: none (--no-spark-checkpoint)")
    else:
        moved = plan.moved_spark_files if done else plan.spark.later_files
        console.print(
            f"  Spark checkpoint {plan.spark.folder}: {len(moved)} file(s) after batch "
            f"{plan.batch_id} {'moved to' if done else 'to move to'} "
            f"restored-by-run-{plan.run_id if done else '<run>'}/",
            soft_wrap=True,
        )
    if done:
        console.print(f"  the query resumes at batch {plan.batch_id + 1}: restart it")


def print_layout_changes(console: Console, layouts: Sequence[Layout]) -> None:
    """The repartitions among ``layouts`` (oldest first per operator), one line each."""
    previous: dict[tuple[str, int, str], int] = {}
    for x in layouts:
        key = (x.root, x.operator_id, x.store_name)
        if x.run_id is not None:
            console.print(
                f"repartition: {x.root} operator {x.operator_id} ({x.store_name}) of query "
                f"{x.query_id}: {previous.get(key, '?')} -> {x.num_partitions} partitions from "
                f"batch {x.from_batch} (snapshots at version {x.from_version}), run {x.run_id} "
                f"at {x.recorded_at:%Y-%m-%d %H:%M:%S}",
                soft_wrap=True,
                highlight=False,
            )
        previous[key] = x.num_partitions


def print_repartition(console: Console, plan: RepartitionPlan) -> None:
    """What a repartition did, or (a dry run) will do: rows and bytes per new partition."""
    done = plan.executed
    head = (
        f"repartition (run {plan.run_id})"
        if done
        else "repartition (dry run: --execute to repartition)"
    )
    console.print(
        f"{head}: query {plan.query_id} below {plan.root} at batch {plan.batch_id}: "
        f"{plan.layout_change()}; new snapshots at version {plan.version}",
        soft_wrap=True,
    )
    for move in plan.moves:
        table = Table("partition", "rows", "bytes", box=None)
        mine = [
            f
            for f in plan.figures
            if (f.operator_id, f.store_name) == (move.operator_id, move.store_name)
        ]
        for f in mine:
            table.add_row(str(f.partition), f"{f.rows:,}", f"{f.bytes:,}")
        console.print(table)
        skew = plan.skew(move.operator_id, move.store_name)
        console.print(
            f"  operator {move.operator_id} ({move.store_name}): {sum(f.rows for f in mine):,} "
            f"rows, skew {'n/a' if skew is None else f'{skew:.2f}'} (largest partition over the "
            f"mean); bytes {'as written, compressed' if done else 'in Arrow, uncompressed'}",
            soft_wrap=True,
        )
    if done:
        console.print(
            f"  switched in one transaction; old files are superseded and go by retention "
            f"(the ledger names run {plan.run_id}). Restart the query with "
            f"num_partitions={plan.num_partitions}: it resumes at batch {plan.batch_id + 1}",
            soft_wrap=True,
        )


def metrics_json(recorded: RecordedBatchMetrics) -> dict[str, Any]:
    """One batch's figures, flat: the recorded columns, then the runtime's extra figures."""
    m = recorded.metrics
    return {
        "root": recorded.root,
        "query_id": recorded.query_id,
        "batch_id": recorded.batch_id,
        "recorded_at": jsonable(recorded.recorded_at),
        "rows_in": m.rows_in,
        "keys_updated": m.keys_updated,
        "state_rows": m.state_rows,
        "bytes_written": m.bytes_written,
        "commit_ms": m.commit_ms,
        "cache_hits": m.cache_hits,
        "cache_misses": m.cache_misses,
    } | {key: jsonable(value) for key, value in m.extra.items()}


def print_metrics(console: Console, query_id: str, batches: Sequence[RecordedBatchMetrics]) -> None:
    """One row per batch, newest first."""
    table = Table(title=f"Batch metrics of query {query_id} ({len(batches)} batches, newest first)")
    for name in ("batch", "recorded", "rows in", "keys updated", "state rows", "written"):
        table.add_column(name, justify="left" if name == "recorded" else "right")
    for name in ("commit", "batch time", "max load", "cache hits"):
        table.add_column(name, justify="right")
    for b in batches:
        m, extra = b.metrics, b.metrics.extra
        looked = m.cache_hits + m.cache_misses
        table.add_row(
            str(b.batch_id),
            b.recorded_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{m.rows_in:,}",
            f"{m.keys_updated:,}",
            f"{m.state_rows:,}",
            size(m.bytes_written),
            millis(m.commit_ms),
            millis(extra.get("batch_ms")),
            millis(extra.get("max_load_ms")),
            f"{m.cache_hits}/{looked}" if looked else "-",
        )
    show(console, table)
