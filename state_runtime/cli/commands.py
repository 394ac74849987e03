"""The ``statestore`` commands: maintain, validate, health, explain, repair, resolve, reconcile.

Exit codes and error output: see :mod:`state_runtime.cli.exits` (and docs/maintenance.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from state_runtime.catalog import Catalog, StoreKey, catalog_url
from state_runtime.cli import output
from state_runtime.cli.exits import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    StatestoreGroup,
    fail,
    show_warnings,
)
from state_runtime.cli.progress import RichProgress
from state_runtime.errors import InvalidArgument
from state_runtime.maintenance import (
    SILENT,
    Fleet,
    MaintenancePolicy,
    Progress,
    canonical_root,
    cleanup_pass,
    damaged_snapshots,
    due_for_snapshot,
    explain_file,
    parse_duration,
    parse_store_key,
    reconcile,
    repair_pass,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime.settings import MAINTENANCE, Setting
from state_runtime.storage import check_relative_path

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass
class Settings:
    """What the group's options resolve to, handed to each command."""

    url: str
    roots: list[str] | None
    quiet: bool
    console: Console = dataclasses.field(default_factory=Console)

    @property
    def progress(self) -> Progress:
        return SILENT if self.quiet else RichProgress()


@contextmanager
def _fleet(settings: Settings) -> Iterator[Fleet]:
    """Open the catalog (read-only until a command writes) and check the roots asked for:
    a root below which the catalog records nothing is bad input, not an empty answer."""
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
        yield Fleet(catalog, roots=settings.roots)
    finally:
        catalog.close()


def _duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
    try:
        return None if value is None else parse_duration(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _policy_option(setting: Setting, option: str) -> Callable[[F], F]:
    """The ``option`` of a declared setting; a value below a safety floor passes to the
    policy, which refuses it with MaintenanceRefused (its own exit code)."""
    if setting.kind == "duration":
        return click.option(option, setting.name, callback=_duration, help=setting.help)
    low = setting.floor if isinstance(setting.floor, int) and not setting.refusal else None
    return click.option(
        option,
        setting.name,
        type=click.IntRange(min=low, max=setting.ceiling),
        help=setting.help,
    )


POLICY_OPTIONS = [setting for setting in MAINTENANCE if setting.option]
"""The maintenance settings the command line overrides, as declared in MAINTENANCE."""


def policy_options(command: F) -> F:
    """Options overriding the maintenance policy (defaults: STATE_MAINTENANCE_* or built-in).
    Zero is a value: ``--orphan-grace 0s`` means no grace."""
    for setting in reversed(POLICY_OPTIONS):
        command = _policy_option(setting, str(setting.option))(command)
    return command


def _policy(options: dict[str, Any]) -> MaintenancePolicy:
    """The environment's policy with the command line's overrides; an invalid value or one
    below the safety floor raises the error naming its option."""
    values: dict[str, object] = {}
    labels: dict[str, str] = {}
    for setting in POLICY_OPTIONS:
        value = options.get(setting.name)
        if value is not None:
            values[setting.name] = value
            labels[setting.name] = f"{setting.option} {setting.text(value)}"
    return MaintenancePolicy.from_env().with_overrides(values, labels)


def _stores(values: tuple[str, ...]) -> list[StoreKey] | None:
    try:
        keys = [parse_store_key(v) for v in values]
        return [StoreKey(canonical_root(k.root), k.store) for k in keys] or None
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param_hint="--store") from None


store_option = click.option(
    "--store",
    "stores",
    multiple=True,
    metavar="ROOT#OP/PART/NAME",
    help="Only this store (repeatable); as 'statestore health' names it.",
)


@click.group(cls=StatestoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--catalog-url",
    envvar="STATE_CATALOG_URL",
    help="Catalog URL (default: $STATE_CATALOG_URL, else ./demo-output/catalog.db).",
)
@click.option(
    "--root",
    "roots",
    multiple=True,
    help="Only stores below this checkpoint root (path or URI; repeatable). Default: all.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no warnings.")
@click.pass_context
def main(ctx: click.Context, /, **kw: Any) -> None:
    """Maintain the state stores recorded in a catalog: snapshots, cleanup, validation."""
    show_warnings(kw["quiet"])
    roots = [canonical_root(r) for r in kw["roots"]] or None
    ctx.obj = Settings(kw.get("catalog_url") or catalog_url(), roots, kw["quiet"])


@main.command()
@click.option(
    "--dry-run/--execute", default=True, help="Only show what cleanup would delete (default)."
)
@click.option("--snapshots/--no-snapshots", default=True, help="Write due snapshots.")
@click.option("--cleanup/--no-cleanup", default=True, help="Delete what retention allows.")
@click.option("--workers", type=click.IntRange(min=1), default=1, help="Stores in parallel.")
@store_option
@policy_options
@click.pass_obj
def maintain(settings: Settings, /, **kw: Any) -> None:
    """Write due snapshots, then clean up (a dry run unless --execute)."""
    policy, only = _policy(kw), _stores(kw["stores"])
    failed = False
    with _fleet(settings) as fleet:
        if kw["cleanup"]:
            policy.check_retention()  # refuse before doing anything
        if kw["snapshots"] and not kw["dry_run"]:
            snaps = snapshot_pass(
                fleet, policy, only=only, progress=settings.progress, workers=kw["workers"]
            )
            output.print_snapshots(settings.console, snaps)
            failed |= bool(snaps.failed)
        elif kw["snapshots"]:
            due = due_for_snapshot(fleet, policy, only)
            output.print_due_snapshots(settings.console, due)
        if kw["cleanup"]:
            report = cleanup_pass(
                fleet, policy, execute=not kw["dry_run"], only=only, progress=settings.progress
            )
            output.print_cleanup(settings.console, report)
            failed |= bool(report.failed)
    sys.exit(EXIT_PROBLEMS if failed else 0)


@main.command()
@click.option("--workers", type=click.IntRange(min=1), default=1, help="Stores in parallel.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
@store_option
@policy_options
@click.pass_obj
def validate(settings: Settings, /, **kw: Any) -> None:
    """Check that every retained version loads: files, sizes, checksums, lineage, commit log."""
    policy, only = _policy(kw), _stores(kw["stores"])
    with _fleet(settings) as fleet:
        report = run_checks(
            fleet, policy, only=only, progress=settings.progress, workers=kw["workers"]
        )
    if kw["as_json"]:
        click.echo(json.dumps(output.checks_json(report), indent=2))
    else:
        output.print_checks(settings.console, report)
    sys.exit(0 if report.ok else EXIT_PROBLEMS)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--sort",
    type=click.Choice(["store", "status", "deltas", "recovery", "reclaimable", "orphans", "lag"]),
    default="store",
    help="Order of the rows.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Show only the first N rows.")
@store_option
@policy_options
@click.pass_obj
def health(settings: Settings, /, **kw: Any) -> None:
    """Each store's status (healthy, degraded, broken, unknown: why, since when) and figures,
    from the catalog (no storage access)."""
    policy, only = _policy(kw), _stores(kw["stores"])
    with _fleet(settings) as fleet:
        reports = output.sorted_reports(store_reports(fleet, policy, only=only), kw["sort"])
    reports = reports[: kw["limit"]] if kw["limit"] else reports
    if kw["as_json"]:
        rows = [{"store": str(r.key)} | r.status_fields() | r.figures() for r in reports]
        click.echo(json.dumps(rows, indent=2))
    else:
        output.print_health(settings.console, reports)


@main.command()
@click.argument("file")
@policy_options
@click.pass_obj
def explain(settings: Settings, /, file: str, **kw: Any) -> None:
    """Why FILE is kept, or why cleanup may delete it, and its store's status.

    FILE is a path relative to its checkpoint root (with --root), an absolute path, or a URI.
    A file the catalog counts on is looked up in storage too: a missing one is never called
    needed; the answer says what is lost and what still loads.
    """
    policy = _policy(kw)
    with _fleet(settings) as fleet:
        root, path = _locate(fleet, file)
        explained = explain_file(fleet, root, path, policy)
    output.print_explanation(settings.console, explained)


def _locate(fleet: Fleet, file: str) -> tuple[str, str]:
    """The (root, relative path) of ``file`` among the catalog's roots."""
    roots = fleet.root_names()
    if "://" not in file and not Path(file).is_absolute():
        if len(roots) != 1:
            fail(EXIT_USAGE, f"{file!r} is relative: name its root with --root (known: {roots})")
        return roots[0], check_relative_path(file)
    uri = file if "://" in file else Path(file).resolve().as_uri()
    for root in sorted(roots, key=len, reverse=True):
        if uri.startswith(root.rstrip("/") + "/"):
            return root, check_relative_path(uri[len(root.rstrip("/")) + 1 :])
    fail(EXIT_USAGE, f"{file!r} is below none of the catalog's roots: {roots}")


@main.command()
@click.option(
    "--dry-run/--execute", default=True, help="Only list the damaged snapshots (default)."
)
@store_option
@policy_options
@click.pass_obj
def repair(settings: Settings, /, **kw: Any) -> None:
    """Rebuild damaged snapshots from their intact deltas (a dry run unless --execute).

    Each new snapshot is verified in memory, the damaged file is recorded and removed, the
    new one is written, read back and verified, and only then replaces the deltas.
    """
    policy, only = _policy(kw), _stores(kw["stores"])
    with _fleet(settings) as fleet:
        if kw["dry_run"]:
            output.print_damaged(settings.console, damaged_snapshots(fleet, policy, only))
            return
        report = repair_pass(fleet, policy, only=only, progress=settings.progress)
    output.print_repairs(settings.console, report)
    sys.exit(EXIT_PROBLEMS if report.failed else 0)


@main.command()
@click.option("--store", "stores", multiple=True, required=True, metavar="ROOT#OP/PART/NAME")
@click.option("--reason", required=True, help="Why the problems are resolved (recorded).")
@click.pass_obj
def resolve(settings: Settings, /, **kw: Any) -> None:
    """Resolve a store's open problems by hand (recorded with the reason): the store is
    cleaned again. The next validation reopens whatever it still finds."""
    only = _stores(kw["stores"]) or []
    with _fleet(settings) as fleet:
        for key in only:
            count = fleet.catalog.resolve_problems(key, f"resolved by hand: {kw['reason']}")
            settings.console.print(f"{key}: {count} open problem(s) resolved")


@main.command(name="reconcile")
@click.option(
    "--dry-run/--record", default=False, help="Only report unknown files (default: record them)."
)
@click.option("--min-age", callback=_duration, help="Skip younger files (default: min window).")
@policy_options
@click.pass_obj
def reconcile_command(settings: Settings, /, **kw: Any) -> None:
    """List storage and record the files the catalog does not know (a rare sweep)."""
    policy = _policy(kw)
    with _fleet(settings) as fleet:
        report = reconcile(
            fleet,
            policy,
            execute=not kw["dry_run"],
            min_age=kw["min_age"],
            progress=settings.progress,
        )
    output.print_reconcile(settings.console, report)
    sys.exit(EXIT_PROBLEMS if report.unreadable else 0)
