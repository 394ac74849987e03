"""The ``statestore`` commands: maintain, validate, health, history, explain, repair, resolve,
restore, repartition, reconcile, relocate, schema-check.

Every command takes ``--json`` (the whole report, see :mod:`state_runtime.cli.jsonable`).
Exit codes and error output: see :mod:`state_runtime.cli.exits` (and docs/maintenance.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from state_runtime.catalog import Catalog, StoreKey, catalog_url
from state_runtime.cli import output
from state_runtime.cli.exits import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    MONITOR_BROKEN,
    MONITOR_DEGRADED,
    MONITOR_HEALTHY,
    MONITOR_UNKNOWN,
    StatestoreGroup,
    fail,
    fail_with,
    show_warnings,
)
from state_runtime.cli.jsonable import echo_json
from state_runtime.cli.progress_bars import RichProgress
from state_runtime.errors import InvalidArgument, StateStoreError
from state_runtime.maintenance import (
    SILENT,
    Fate,
    Fleet,
    Progress,
    beyond_repair,
    canonical_root,
    check_schema_change,
    cleanup_pass,
    damaged_files,
    due_for_snapshot,
    explain_file,
    parse_duration,
    parse_store_key,
    plan_restore,
    reconcile,
    relocate_root,
    repair_pass,
    restore_query,
    run_checks,
    schema_changes,
    snapshot_pass,
    store_reports,
)
from state_runtime.maintenance.health import StoreReport
from state_runtime.maintenance.policy import PRESETS, MaintenancePolicy
from state_runtime.redaction import redact
from state_runtime.settings import MAINTENANCE, Setting
from state_runtime.status import StoreStatus
from state_runtime.storage import check_relative_path
from state_runtime.store.schema_evolution import SchemaChange

F = TypeVar("F", bound=Callable[..., Any])


def make_console() -> Console:
    """Rich output fitted to the width ``COLUMNS`` gives, else to the terminal; on a pipe or a
    file without ``COLUMNS`` (CI logs, ``| cat``) no width limit, so every row is one line,
    whole. Tables wrap what does not fit, never cut it (:func:`output.show`)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return Console()
    return Console(width=1_000_000)


@dataclasses.dataclass
class Settings:
    """What the group's options resolve to, handed to each command."""

    url: str
    roots: list[str] | None
    quiet: bool
    policy: str = "default"
    console: Console = dataclasses.field(default_factory=make_console)

    @property
    def progress(self) -> Progress:
        return SILENT if self.quiet else RichProgress()


@contextmanager
def _fleet(settings: Settings, *, storage: bool = False) -> Iterator[Fleet]:
    """Open the catalog (read-only until a command writes) and check the roots asked for:
    a root below which the catalog records nothing is bad input, not an empty answer. With
    ``storage``, open each root's storage too; a root that cannot be opened is set aside
    (the others are maintained, and :func:`_exit` names it)."""
    catalog = Catalog.open(settings.url)
    try:
        if settings.roots is not None:
            known = set(catalog.roots())
            unknown = [root for root in settings.roots if root not in known]
            if unknown:
                fail(
                    EXIT_USAGE,
                    f"nothing is recorded below {', '.join(unknown)} in the catalog at "
                    f"{catalog.url} (it knows {len(known)} root(s)"
                    + (f": {', '.join(sorted(known)[:5])}" if known else "")
                    + ")",
                )
        fleet = Fleet(catalog, roots=settings.roots)
        if storage:
            fleet.open_roots()
        yield fleet
    finally:
        catalog.close()


def _exit(fleet: Fleet, failed: bool) -> NoReturn:
    """Exit 1 if some work ``failed`` or a root was set aside (each named on stderr: some
    work failed, the other roots were maintained), else 0."""
    for root, why in sorted(fleet.failed_roots.items()):
        click.echo(
            redact(f"error: root {root} was not maintained (some work failed): {why}"), err=True
        )
    sys.exit(EXIT_PROBLEMS if failed or fleet.failed_roots else 0)


def _duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
    try:
        return None if value is None else parse_duration(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _policy_option(setting: Setting, option: str) -> Callable[[F], F]:
    """The ``option`` of a declared setting; a value below a safety floor passes to the
    policy, which refuses it with MaintenanceRefused (its own exit code)."""
    default = f"{setting.text(setting.default)}, or {setting.env}"
    if setting.kind == "duration":
        return click.option(
            option, setting.name, callback=_duration, help=setting.help, show_default=default
        )
    low = setting.floor if isinstance(setting.floor, int) and not setting.refusal else None
    return click.option(
        option,
        setting.name,
        type=click.IntRange(min=low, max=setting.ceiling),
        help=setting.help,
        show_default=default,
    )


POLICY_OPTIONS = [setting for setting in MAINTENANCE if setting.option]
"""The maintenance settings the command line overrides, as declared in MAINTENANCE."""


RETENTION = ("retain_versions", "window", "orphan_grace")
"""The settings of the retention rule: what a command judging files by it uses."""


def policy_options(*used: str) -> Callable[[F], F]:
    """Options overriding the settings ``used`` by the command (all when none is named), so
    that its help lists only those (defaults: STATE_MAINTENANCE_* or built-in). Zero is a
    value: ``--orphan-grace 0s`` means no grace."""

    def decorate(command: F) -> F:
        for setting in reversed(POLICY_OPTIONS):
            if not used or setting.name in used:
                command = _policy_option(setting, str(setting.option))(command)
        return command

    return decorate


def _policy(settings: Settings, options: dict[str, Any]) -> MaintenancePolicy:
    """The named policy with the environment's and the command line's overrides; an invalid
    value or one below the safety floor raises the error naming its option."""
    values: dict[str, object] = {}
    labels: dict[str, str] = {}
    for setting in POLICY_OPTIONS:
        value = options.get(setting.name)
        if value is not None:
            values[setting.name] = value
            labels[setting.name] = f"{setting.option} {setting.text(value)}"
    return MaintenancePolicy.from_env(preset=settings.policy).with_overrides(values, labels)


def _stores(fleet: Fleet, values: tuple[str, ...]) -> list[StoreKey] | None:
    """The stores named by ``--store``: ``ROOT#OP/PART/NAME``, or ``OP/PART/NAME`` (as
    ``health`` prints them below its one root) when the stores in scope have one root. A store
    the catalog does not know is bad input."""
    if not values:
        return None
    roots = fleet.root_names()
    known = {record.key for record in fleet.stores()}
    keys: list[StoreKey] = []
    for value in values:
        try:
            if "#" in value:
                key = parse_store_key(value)
                key = StoreKey(canonical_root(key.root), key.store)
            elif len(roots) == 1:
                key = StoreKey(roots[0], parse_store_key(value, root=roots[0]).store)
            else:
                fail(
                    EXIT_USAGE,
                    f"--store {value!r} names no root and {len(roots)} roots are in scope: "
                    "write ROOT#OP/PART/NAME or pass --root",
                )
        except InvalidArgument as exc:
            fail(EXIT_USAGE, f"--store: {exc}")
        if key not in known:
            below = sorted(str(k.store) for k in known if k.root == key.root)
            fail(
                EXIT_USAGE,
                f"--store {value!r}: no store {key.store} below {key.root} in the catalog at "
                f"{fleet.catalog.url}"
                + (
                    f" (it knows {', '.join(below[:5])}{', ...' if len(below) > 5 else ''})"
                    if below
                    else " (no stores below that root)"
                ),
            )
        keys.append(key)
    return keys


store_option = click.option(
    "--store",
    "stores",
    multiple=True,
    metavar="[ROOT#]OP/PART/NAME",
    help="Only this store (repeatable), as 'statestore health' prints it; the root may be "
    "left out when the stores in scope have one.",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the whole report as JSON (see docs)."
)


@click.group(
    cls=StatestoreGroup,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "show_default": True,
        "max_content_width": 120,
    },
)
@click.version_option(package_name="state-runtime", prog_name="statestore")
@click.option(
    "--catalog-url",
    envvar="STATE_CATALOG_URL",
    help="Catalog URL.",
    show_default="$STATE_CATALOG_URL, else sqlite:///demo-output/catalog.db",
)
@click.option(
    "--root",
    "roots",
    multiple=True,
    help="Only stores below this checkpoint root (path or URI; repeatable).",
    show_default="all",
)
@click.option(
    "--policy",
    type=click.Choice(sorted(PRESETS)),
    default="default",
    help="Named maintenance policy; STATE_MAINTENANCE_* and the options override it. 'demo': "
    "no retention window, snapshots after 2 deltas: for a finished demo stream only.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no warnings.")
@click.pass_context
def main(ctx: click.Context, /, **kw: Any) -> None:
    """Maintain the state stores recorded in a catalog: snapshots, cleanup, validation."""
    show_warnings(kw["quiet"])
    roots = [canonical_root(r) for r in kw["roots"]] or None
    ctx.obj = Settings(kw.get("catalog_url") or catalog_url(), roots, kw["quiet"], kw["policy"])


@main.command()
@click.option("--dry-run/--execute", default=True, help="Only show what cleanup would delete.")
@click.option("--snapshots/--no-snapshots", default=True, help="Write due snapshots.")
@click.option("--cleanup/--no-cleanup", default=True, help="Delete what retention allows.")
@click.option("--workers", type=click.IntRange(min=1), default=1, help="Stores in parallel.")
@json_option
@store_option
@policy_options()
@click.pass_obj
def maintain(settings: Settings, /, **kw: Any) -> None:
    """Write due snapshots, then clean up (a dry run unless --execute)."""
    policy, as_json = _policy(settings, kw), kw["as_json"]
    done: dict[str, Any] = {}
    failed = False
    with _fleet(settings, storage=True) as fleet:
        only = _stores(fleet, kw["stores"])
        if kw["cleanup"]:
            policy.check_retention()  # refuse before doing anything
        if kw["snapshots"] and not kw["dry_run"]:
            snaps = snapshot_pass(
                fleet, policy, only=only, progress=settings.progress, workers=kw["workers"]
            )
            done["snapshots"] = snaps
            if not as_json:
                output.print_snapshots(settings.console, snaps)
            failed |= bool(snaps.failed)
        elif kw["snapshots"]:
            due = due_for_snapshot(fleet, policy, only)
            done["due_snapshots"] = due
            if not as_json:
                output.print_due_snapshots(settings.console, due)
        if kw["cleanup"]:
            report = cleanup_pass(
                fleet, policy, execute=not kw["dry_run"], only=only, progress=settings.progress
            )
            done["cleanup"] = report
            if not as_json:
                output.print_cleanup(settings.console, report)
            failed |= bool(report.failed)
    if as_json:
        done["failed_roots"] = fleet.failed_roots
        echo_json({"policy": policy.parameters(), "dry_run": kw["dry_run"]} | done)
    _exit(fleet, failed)


@main.command()
@click.option("--workers", type=click.IntRange(min=1), default=1, help="Stores in parallel.")
@json_option
@store_option
@policy_options(*RETENTION, "min_window")
@click.pass_obj
def validate(settings: Settings, /, **kw: Any) -> None:
    """Check that every retained version loads: files, sizes, checksums, lineage, commit log."""
    policy = _policy(settings, kw)
    with _fleet(settings, storage=True) as fleet:
        only = _stores(fleet, kw["stores"])
        report = run_checks(
            fleet, policy, only=only, progress=settings.progress, workers=kw["workers"]
        )
    if kw["as_json"]:
        echo_json(output.checks_json(report))
    else:
        output.print_checks(settings.console, report)
    _exit(fleet, not report.ok)


@main.command()
@json_option
@click.option(
    "--sort",
    type=click.Choice(["store", "status", "deltas", "recovery", "reclaimable", "orphans", "lag"]),
    default="store",
    help="Order of the rows.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Show only the first N rows.")
@store_option
@policy_options(*RETENTION)
@click.pass_obj
def health(settings: Settings, /, **kw: Any) -> None:
    """Each store's status (healthy, degraded, broken, unknown: why, since when) and figures,
    from the catalog (no storage access). Exit code for monitors: 0 healthy, 1 degraded,
    2 broken, 3 unknown (or the command failed). 'status' is the same command."""
    try:
        policy = _policy(settings, kw)
        with _fleet(settings) as fleet:
            only = _stores(fleet, kw["stores"])
            reports = output.sorted_reports(store_reports(fleet, policy, only=only), kw["sort"])
    except StateStoreError as exc:
        fail_with(exc, as_json=kw["as_json"], code=MONITOR_UNKNOWN)
    except SystemExit as exc:  # bad input (an unknown root or store), already printed
        sys.exit(MONITOR_UNKNOWN if exc.code else exc.code)
    code = monitor_code(reports)
    reports = reports[: kw["limit"]] if kw["limit"] else reports
    if kw["as_json"]:
        echo_json([output.health_json(r) for r in reports])
    else:
        output.print_health(settings.console, reports)
    sys.exit(code)


main.add_command(health, name="status")


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


@main.command()
@click.option("--query", "query_id", help="Only the versions this query committed.")
@click.option("--by-batch", is_flag=True, help="One line per micro-batch (all its stores) instead.")
@click.option(
    "--schemas", is_flag=True, help="Each operator store's schema changes, with their batch."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    help="Newest versions per root; with --by-batch, newest whole micro-batches per root.",
)
@json_option
@store_option
@click.pass_obj
def history(settings: Settings, /, **kw: Any) -> None:
    """Committed versions, newest first, like Delta's DESCRIBE HISTORY: the batch and query
    that committed each, its checkpoint id, when, state rows, the delta's bytes, and what
    became of its files (snapshots written, files deleted and why). With --schemas: each
    schema change instead, from which batch, and what it changed."""
    with _fleet(settings) as fleet:
        only = _stores(fleet, kw["stores"])
        roots = fleet.root_names(only)
        if kw["schemas"]:
            changes = schema_changes(fleet.catalog, roots)
            if kw["as_json"]:
                echo_json(changes)
            else:
                output.print_schema_changes(settings.console, changes)
            return
        query = kw["query_id"]
        known = sorted({q for root in roots for q in fleet.catalog.query_ids(root)})
        if query is not None and query not in known:
            fail(
                EXIT_USAGE,
                f"--query {query!r}: no such query committed below {', '.join(roots)} "
                f"(known: {', '.join(known[:10]) or 'none'})",
            )
        entries = []
        layouts = [x for root in roots for x in fleet.catalog.layout_history(root)]
        for root in roots:
            wanted = None if only is None else [k.store for k in only if k.root == root]
            # A batch commits at most one version per store: N batches fit in N x stores rows.
            per_batch = len(wanted) if wanted is not None else len(fleet.catalog.stores(root))
            rows = kw["limit"] * max(per_batch, 1) if kw["by_batch"] else kw["limit"]
            found = fleet.catalog.version_history(root, stores=wanted, query_id=query, limit=rows)
            entries += output.newest_batches(found, kw["limit"]) if kw["by_batch"] else found
    if kw["by_batch"]:
        batches = output.batch_history(entries)
        if kw["as_json"]:
            echo_json(batches)
        else:
            output.print_batch_history(settings.console, batches)
    elif kw["as_json"]:
        echo_json(entries)
    else:
        output.print_history(settings.console, entries)
    if not kw["as_json"]:
        output.print_layout_changes(settings.console, layouts)


@main.command()
@click.argument("file")
@json_option
@policy_options(*RETENTION)
@click.pass_obj
def explain(settings: Settings, /, file: str, **kw: Any) -> None:
    """Why FILE is kept, or why cleanup may delete it, and its store's status.

    FILE is a URI, an absolute path, or a path relative to the current folder or to its
    checkpoint root; one that could name files below several roots is refused. A file the
    catalog counts on is looked up in storage too: a missing one is never called needed; a
    missing or damaged one gets its fate and the next command, as repair and validate say.
    """
    policy = _policy(settings, kw)
    with _fleet(settings) as fleet:
        root, path = _locate(fleet, file, policy)
        explained = explain_file(fleet, root, path, policy)
    if kw["as_json"]:
        echo_json(explained)
    else:
        output.print_explanation(settings.console, explained)


def _locate(fleet: Fleet, file: str, policy: MaintenancePolicy) -> tuple[str, str]:
    """The (root, relative path) that ``file`` names: a URI, an absolute path, a path
    relative to the current folder (as the shell completes it) or to a root. Refused when it
    is below no root, or when several readings name files the catalog or storage knows."""
    roots = fleet.root_names()
    if "://" in file or Path(file).is_absolute():
        uris = [file if "://" in file else Path(os.path.abspath(file)).as_uri()]
    else:
        uris = [Path(os.path.abspath(file)).as_uri()]
        uris += [f"{root.rstrip('/')}/{file}" for root in roots]
    readings = sorted(
        {
            (root, uri[len(root.rstrip("/")) + 1 :])
            for uri in uris
            for root in roots
            if uri.startswith(root.rstrip("/") + "/")
        }
    )
    if not readings:
        fail(EXIT_USAGE, f"{file!r} is below none of the catalog's roots: {', '.join(roots)}")
    known = [r for r in readings if _names_a_file(fleet, policy, *r)]
    if len(known) > 1 or (not known and len(readings) > 1):
        named = "; ".join(f"{path} below {root}" for root, path in known or readings)
        fail(EXIT_USAGE, f"{file!r} is ambiguous: it names {named}; give its absolute path")
    root, path = (known or readings)[0]
    return root, check_relative_path(path)


def _names_a_file(fleet: Fleet, policy: MaintenancePolicy, root: str, path: str) -> bool:
    """Whether the catalog records ``path`` below ``root`` or storage has it there."""
    try:
        relative = check_relative_path(path)
    except InvalidArgument:
        return False
    explained = fleet.catalog.explain(root, relative, policy.retention)
    return explained.file is not None or fleet.storage(root).exists(relative)


@main.command()
@click.option("--dry-run/--execute", default=True, help="Only list the damaged snapshots.")
@json_option
@store_option
@policy_options(*RETENTION)
@click.pass_obj
def repair(settings: Settings, /, **kw: Any) -> None:
    """Rebuild damaged snapshots from their intact deltas (a dry run unless --execute).

    Each new snapshot is verified in memory, the damaged file is recorded and removed, the
    new one is written, read back and verified, and only then replaces the deltas.
    """
    policy = _policy(settings, kw)
    with _fleet(settings, storage=True) as fleet:
        only = _stores(fleet, kw["stores"])
        done: dict[str, Any] = {"dry_run": kw["dry_run"]}
        if kw["dry_run"]:
            found = damaged_files(fleet, policy, only)
            rebuild = found.of(Fate.REPAIRABLE)
            left = found.beyond_repair()
            done["rebuild"] = [d.details() for d in rebuild]
        else:
            done["report"] = repair_pass(fleet, policy, only=only, progress=settings.progress)
            left = beyond_repair(fleet, policy, only)
        done["beyond_repair"] = [d.details() for d in left.damages] + left.other
    if kw["as_json"]:
        echo_json(done)
    else:
        if kw["dry_run"]:
            output.print_damaged(settings.console, rebuild)
        else:
            output.print_repairs(settings.console, done["report"])
        output.print_beyond_repair(settings.console, left)
    failed = not kw["dry_run"] and bool(done["report"].failed)
    _exit(fleet, failed or bool(left.damages or left.other))


@main.command()
@click.option("--store", "stores", multiple=True, required=True, metavar="[ROOT#]OP/PART/NAME")
@click.option("--reason", required=True, help="Why the problems are resolved (recorded).")
@json_option
@click.pass_obj
def resolve(settings: Settings, /, **kw: Any) -> None:
    """Resolve a store's open problems by hand (recorded with the reason): the store is
    cleaned again. The next validation reopens whatever it still finds."""
    resolved: dict[str, int] = {}
    with _fleet(settings) as fleet:
        for key in _stores(fleet, kw["stores"]) or []:
            count = fleet.catalog.resolve_problems(key, f"resolved by hand: {kw['reason']}")
            resolved[str(key)] = count
            if not kw["as_json"]:
                settings.console.print(f"{key}: {count} open problem(s) resolved")
    if kw["as_json"]:
        echo_json({"resolved": resolved, "reason": kw["reason"]})


@main.command()
@click.argument("root")
@click.option("--query", "query_id", required=True, help="The query whose stores to restore.")
@click.option(
    "--to-batch",
    "batch_id",
    type=click.IntRange(min=0),
    required=True,
    help="The committed batch to return to; the query resumes at the next one.",
)
@click.option(
    "--spark-checkpoint",
    metavar="DIR",
    help="The query's Spark checkpoint folder: its offsets and commits after the batch are "
    "moved aside, so that Spark resumes at the same batch.",
)
@click.option(
    "--no-spark-checkpoint", is_flag=True, help="The query runs without a Spark checkpoint."
)
@click.option(
    "--allow-lost-state",
    is_flag=True,
    help="Accept the loss of stores whose state at the batch does not load: they start "
    "again from empty (named in the plan).",
)
@click.option("--dry-run/--execute", default=True, help="Only check and show the plan.")
@json_option
@click.pass_obj
def restore(settings: Settings, /, root: str, **kw: Any) -> None:
    """Return a query's stores to an earlier, intact batch (a dry run unless --execute).

    Every store's files at the batch are read and verified first; later versions stay in the
    inventory as orphans that cleanup deletes (the ledger names the restore). Stop the query
    first; restart it afterwards: it resumes at the next batch.
    """
    if kw["spark_checkpoint"] and kw["no_spark_checkpoint"]:
        fail(EXIT_USAGE, "--spark-checkpoint and --no-spark-checkpoint exclude each other")
    spark = "" if kw["no_spark_checkpoint"] else kw["spark_checkpoint"]
    settings.roots = [canonical_root(root)]
    with _fleet(settings) as fleet:
        plan = plan_restore(
            fleet,
            settings.roots[0],
            kw["query_id"],
            kw["batch_id"],
            spark_checkpoint=spark,
            allow_lost_state=kw["allow_lost_state"],
        )
        if not kw["dry_run"]:
            plan = restore_query(fleet, plan, _policy(settings, {}))
    if kw["as_json"]:
        echo_json(plan)
    else:
        output.print_restore(settings.console, plan)


@main.command()
@click.argument("root")
@click.option("--query", "query_id", required=True, help="The query to repartition.")
@click.option(
    "--operator",
    "operator_id",
    type=click.IntRange(min=0),
    help="Only this operator (all its stores); default: every operator of the query.",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1, max=100_000),
    required=True,
    help="The new number of state partitions.",
)
@click.option(
    "--spark-checkpoint",
    metavar="DIR",
    help="The query's Spark checkpoint folder: it must have committed the catalog's last batch.",
)
@click.option(
    "--no-spark-checkpoint", is_flag=True, help="The query runs without a Spark checkpoint."
)
@click.option(
    "--idle",
    default="60s",
    callback=_duration,
    help="Refuse while the query committed a batch more recently than this (default 60s).",
)
@click.option(
    "--master",
    default="local[2]",
    help="Spark master for the job (SPARK_REMOTE, when set, makes it a Spark Connect client).",
)
@click.option("--dry-run/--execute", default=True, help="Only route the keys and show the plan.")
@json_option
@click.pass_obj
def repartition(settings: Settings, /, root: str, **kw: Any) -> None:
    """Change a stopped query's number of state partitions (a dry run unless --execute).

    A Spark job routes every key with the runtime's rule and writes one snapshot per new
    partition; one catalog transaction switches the layout, so that the query restarts with
    num_partitions=N. The dry run shows rows and bytes per new partition and the skew.
    """
    from state_runtime.maintenance.repartition import repartition as run_repartition
    from state_runtime.runtime.session import spark_session

    if kw["spark_checkpoint"] and kw["no_spark_checkpoint"]:
        fail(EXIT_USAGE, "--spark-checkpoint and --no-spark-checkpoint exclude each other")
    settings.roots = [canonical_root(root)]
    with _fleet(settings, storage=True) as fleet:
        spark = spark_session(kw["master"], app_name="statestore-repartition")
        plan = run_repartition(
            spark,
            fleet,
            settings.roots[0],
            kw["query_id"],
            kw["partitions"],
            operator_id=kw["operator_id"],
            spark_checkpoint="" if kw["no_spark_checkpoint"] else kw["spark_checkpoint"],
            execute=not kw["dry_run"],
            policy=_policy(settings, {}),
            idle=kw["idle"],
            progress=settings.progress,
        )
    if kw["as_json"]:
        echo_json(plan)
    else:
        output.print_repartition(settings.console, plan)


@main.command()
@click.argument("root")
@click.option("--query", "query_id", required=True, help="The query whose batches to show.")
@click.option("--limit", type=click.IntRange(min=1), default=50, help="Newest batches.")
@json_option
@click.pass_obj
def metrics(settings: Settings, /, root: str, **kw: Any) -> None:
    """Each micro-batch's figures as the runtime recorded them, newest first: rows in, keys
    updated, state rows, bytes written, commit time, batch time, load time, cache hits (the
    view state_batch_metrics holds the same)."""
    settings.roots = [canonical_root(root)]
    with _fleet(settings) as fleet:
        known = fleet.catalog.query_ids(settings.roots[0])
        if kw["query_id"] not in known:
            fail(
                EXIT_USAGE,
                f"--query {kw['query_id']!r}: no such query committed below {settings.roots[0]} "
                f"(known: {', '.join(known[:10]) or 'none'})",
            )
        batches = fleet.catalog.batch_metrics(settings.roots[0], kw["query_id"], limit=kw["limit"])
    if kw["as_json"]:
        echo_json([output.metrics_json(b) for b in batches])
    else:
        output.print_metrics(settings.console, kw["query_id"], batches)


@main.command(name="reconcile")
@click.option("--dry-run/--record", default=False, help="Only report unknown files.")
@click.option(
    "--min-age", callback=_duration, help="Skip younger files.", show_default="--min-window"
)
@json_option
@policy_options(*RETENTION, "min_window")
@click.pass_obj
def reconcile_command(settings: Settings, /, **kw: Any) -> None:
    """List storage and record the files the catalog does not know (a rare sweep)."""
    policy = _policy(settings, kw)
    with _fleet(settings, storage=True) as fleet:
        report = reconcile(
            fleet,
            policy,
            execute=not kw["dry_run"],
            min_age=kw["min_age"],
            progress=settings.progress,
        )
    if kw["as_json"]:
        echo_json(report)
    else:
        output.print_reconcile(settings.console, report)
    _exit(fleet, bool(report.unreadable))


@main.command()
@click.argument("old")
@click.argument("new")
@click.option("--dry-run/--execute", default=True, help="Only check the files at NEW.")
@json_option
@click.pass_obj
def relocate(settings: Settings, /, old: str, new: str, **kw: Any) -> None:
    """Record NEW as the root of every store below OLD, after the root's files were moved or
    copied there (for a PostgreSQL catalog; a SQLite catalog beside its root moves with it).
    Every committed file the catalog knows below OLD must be at NEW first."""
    settings.roots = [canonical_root(old)]
    with _fleet(settings) as fleet:
        report = relocate_root(fleet.catalog, settings.roots[0], new, execute=not kw["dry_run"])
    if kw["as_json"]:
        echo_json(report)
    else:
        output.print_relocation(settings.console, report)
    sys.exit(EXIT_PROBLEMS if report.missing else 0)


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


@main.command("schema-check")
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
    with _fleet(settings) as fleet:
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
    if kw["as_json"]:
        echo_json(check)
    else:
        output.print_schema_check(settings.console, check)
    sys.exit(0 if check.allowed else EXIT_PROBLEMS)
