"""Inspection of the present: ``health`` (``status``), ``explain`` and ``schema-check``,
with their printers (the history commands are in :mod:`state_runtime.cli.history`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from state_runtime.cli.exits import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    MONITOR_BROKEN,
    MONITOR_DEGRADED,
    MONITOR_HEALTHY,
    MONITOR_UNKNOWN,
    fail,
    fail_with,
)
from state_runtime.cli.group import (
    RETENTION,
    Settings,
    emit,
    json_option,
    open_fleet,
    policy_of,
    policy_options,
    store_option,
    stores_of,
)
from state_runtime.cli.jsonable import jsonable
from state_runtime.cli.printing import below, print_prefix, root_prefix, show
from state_runtime.errors import InvalidArgument, StateStoreError
from state_runtime.maintenance import (
    FileExplanation,
    SchemaCheck,
    Status,
    StoreReport,
    StoreStatus,
    canonical_root,
    check_schema_change,
    explain_file,
    health_summary,
    locate_file,
    store_reports,
)
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.units import age, size

BRIEF_BELOW = 120
"""Below this width ``health`` prints one line per store unless ``--table`` asks."""


@click.command()
@json_option
@click.option(
    "--sort",
    type=click.Choice(["store", "status", "deltas", "recovery", "reclaimable", "orphans", "lag"]),
    default="store",
    help="Order of the rows.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Show only the first N rows.")
@click.option(
    "--brief/--table",
    default=None,
    help="One line per store (store, status, since, why), or the table of figures.",
    show_default=f"brief below {BRIEF_BELOW} columns, else the table",
)
@store_option
@policy_options(*RETENTION)
@click.pass_obj
def health(settings: Settings, /, **kw: Any) -> None:
    """Each store's status (healthy, degraded, broken, unknown: why, since when) and figures,
    from the catalog (no storage access). Exit code for monitors: 0 healthy, 1 degraded,
    2 broken, 3 unknown (or the command failed). 'status' is the same command."""
    brief = kw["brief"] if kw["brief"] is not None else settings.console.width < BRIEF_BELOW
    try:
        policy = policy_of(settings, kw)
        with open_fleet(settings) as fleet:
            only = stores_of(fleet, kw["stores"])
            reports = sorted_reports(store_reports(fleet, policy, only=only), kw["sort"])
    except StateStoreError as exc:
        fail_with(exc, as_json=kw["as_json"], code=MONITOR_UNKNOWN)
    except SystemExit as exc:  # bad input (an unknown root or store), already printed
        sys.exit(MONITOR_UNKNOWN if exc.code else exc.code)
    code = monitor_code(reports)
    reports = reports[: kw["limit"]] if kw["limit"] else reports
    printer = print_health_brief if brief else print_health
    emit(reports, printer, as_json=lambda shown: [health_json(r) for r in shown])
    sys.exit(code)


def monitor_code(reports: Sequence[StoreReport]) -> int:
    """The monitoring-plugin exit code of the stores' statuses: the worst of broken (2),
    degraded (1), unknown (3), healthy (0), in that order; no store at all is unknown."""
    found = {r.status.status for r in reports}
    for status, code in (
        (StoreStatus.BROKEN, MONITOR_BROKEN),
        (StoreStatus.DEGRADED, MONITOR_DEGRADED),
        (StoreStatus.UNKNOWN, MONITOR_UNKNOWN),
    ):
        if status in found:
            return code
    return MONITOR_HEALTHY if found else MONITOR_UNKNOWN


@click.command()
@click.argument("file")
@json_option
@policy_options(*RETENTION)
@click.pass_obj
def explain(settings: Settings, /, file: str, **kw: Any) -> None:
    """Why FILE is kept, or why cleanup may delete it, and its store's status.

    FILE is a URI, an absolute path, or a path relative to the current folder or to its
    checkpoint root; one that names no known file, or files below several roots, is refused.
    A file the catalog counts on is looked up in storage too: a missing one is never called
    needed; a missing or damaged one gets its fate and the next command, as repair says.
    """
    policy = policy_of(settings, kw)
    with open_fleet(settings) as fleet:
        root, path = locate_file(fleet, file, policy)
        explained = explain_file(fleet, root, path, policy)
    emit(explained, print_explanation)


def _pairs(option: str, values: tuple[str, ...], parse: Callable[[str], Any]) -> dict[str, Any]:
    """``NAME=VALUE`` options as a dict (a usage error names the malformed one)."""
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            fail(EXIT_USAGE, f"{option} {value!r}: expected NAME=VALUE")
        try:
            pairs[name] = parse(rest)
        except ValueError as exc:
            fail(EXIT_USAGE, f"{option} {value!r}: {exc}")
    return pairs


@click.command("schema-check")
@click.argument("root")
@click.option("--query", "query_id", required=True, help="The query that runs the operator.")
@click.option("--operator", "operator_id", type=click.IntRange(min=0), required=True)
@click.option("--store-name", default="default", help="The operator's store name.")
@click.option("--value-schema", required=True, help="The new value schema (Spark DDL).")
@click.option("--key-schema", help="The new key schema (Spark DDL).", show_default="unchanged")
@click.option("--renamed", multiple=True, metavar="OLD=NEW", help="A declared rename.")
@click.option("--dropped", multiple=True, metavar="FIELD", help="A declared drop.")
@click.option(
    "--default", "defaults", multiple=True, metavar="FIELD=JSON", help="An added field's default."
)
@json_option
@click.pass_obj
def schema_check(settings: Settings, /, root: str, **kw: Any) -> None:
    """Whether a change of an operator's state schema is allowed, and what it will do, before
    a deployment (exit 1 if refused). Reads the catalog only."""
    change = SchemaChange(
        renamed=_pairs("--renamed", kw["renamed"], str),
        dropped=kw["dropped"],
        defaults=_pairs("--default", kw["defaults"], json.loads),
    )
    settings.roots = [canonical_root(root)]
    with open_fleet(settings) as fleet:
        try:
            check = check_schema_change(
                fleet.catalog,
                settings.roots[0],
                kw["query_id"],
                kw["operator_id"],
                kw["store_name"],
                kw["value_schema"],
                change,
                kw["key_schema"],
            )
        except InvalidArgument as exc:
            fail(EXIT_USAGE, str(exc))
    emit(check, print_schema_check)
    sys.exit(0 if check.allowed else EXIT_PROBLEMS)


def print_health(console: Console, reports: Sequence[StoreReport]) -> None:
    """One row per store; the root (or the folder the roots share) is printed once above the
    table, each row shows the rest."""
    roots = {r.key.root for r in reports}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    table = Table(
        title=health_summary(reports),
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


def print_health_brief(console: Console, reports: Sequence[StoreReport]) -> None:
    """One line per store: its name below the root printed once, its status, since when and
    why (a reason longer than the line wraps below it, never cut)."""
    roots = {r.key.root for r in reports}
    prefix = root_prefix(roots)
    print_prefix(console, prefix, roots)
    names = [below(prefix, r.key.root, f"#{r.key.store}") for r in reports]
    statuses = [r.status.status.value for r in reports]
    sinces = [r.status.since_text("%Y-%m-%d %H:%M") for r in reports]
    wide = [max(map(len, column), default=0) for column in (names, statuses, sinces)]
    for r, name, status, since in zip(reports, names, statuses, sinces, strict=True):
        colour = _COLOURS[r.status.status]
        line = Text(f"{name:<{wide[0]}}  ")
        line.append(f"{status:<{wide[1]}}", style=colour)
        line.append(f"  since {since:<{wide[2]}}  {r.status.reason}")
        console.print(line, overflow="fold")


_COLOURS = {
    StoreStatus.HEALTHY: "green",
    StoreStatus.DEGRADED: "yellow",
    StoreStatus.BROKEN: "red",
    StoreStatus.UNKNOWN: "dim",
}


def status_label(status: Status) -> str:
    """The status, coloured, with since when."""
    since = "" if status.since is None else f" since {status.since_text('%Y-%m-%d %H:%M')}"
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


def print_explanation(console: Console, explained: FileExplanation) -> None:
    """At most 7 lines, each one line however narrow the terminal (no line is wrapped into
    several: a path or the command stays whole to copy); the file's checkpoint id is in its
    name, not repeated."""
    e = explained.explanation
    lines = [f"[bold]{escape(e.root)}/{escape(e.path)}[/bold]", f"verdict: {e.verdict.value}"]
    lines.append(f"why: {escape(e.reason)}")
    if e.file is not None:
        f = e.file
        lines.append(
            f"file: {f.kind.value} of store {f.key.store}, version {f.version}, "
            f"{size(f.size_bytes)}, {f.file_rows} rows, {f.state}, written "
            f"{f.created_at.isoformat()} (writer's clock), recorded "
            f"{f.recorded_at.isoformat()} (its age counts from the later)"
        )
    if e.needed_by is not None and e.verdict.value == "needed":
        lo, hi = e.needed_by
        lines.append(f"needed by retained versions {lo}..{hi}")
    if explained.status is not None:  # a damaged file's advice below says what its reason says
        why = "" if explained.damage else f": {explained.status.reason}"
        lines.append(f"store status: {status_label(explained.status)}{escape(why)}")
    if explained.damage is not None:
        lines.append(f"next: {escape(explained.damage.advice)}")
    for line in lines:
        console.print(line, soft_wrap=True)


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
