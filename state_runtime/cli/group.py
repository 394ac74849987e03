"""The ``statestore`` group and what every command family shares: the group's options and
what they resolve to (:class:`Settings`), the maintenance-policy, ``--store`` and ``--json``
options, opening the fleet, the exit code of a pass.

Exit codes and error output: see :mod:`state_runtime.cli.exits` (and docs/maintenance.md).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from state_runtime.catalog import (
    Catalog,
    StoreKey,
    catalog_url,
)
from state_runtime.cli.exits import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    StatestoreGroup,
    fail,
    show_warnings,
)
from state_runtime.cli.jsonable import echo_json
from state_runtime.cli.progress_bars import RichProgress
from state_runtime.errors import InvalidArgument
from state_runtime.maintenance import (
    SILENT,
    Fleet,
    Progress,
    canonical_root,
    parse_duration,
    parse_store_key,
)
from state_runtime.maintenance.policy import PRESETS, MaintenancePolicy
from state_runtime.maintenance.spread import Spread
from state_runtime.redaction import redact
from state_runtime.settings import MAINTENANCE, Setting

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def make_console() -> Console:
    """Rich output fitted to the width ``COLUMNS`` gives, else to the terminal; on a pipe or a
    file without ``COLUMNS`` (CI logs, ``| cat``) no width limit, so every row is one line,
    whole. Tables wrap what does not fit, never cut it (:func:`state_runtime.cli.printing.show`)."""
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
def open_fleet(settings: Settings, *, storage: bool = False) -> Iterator[Fleet]:
    """Open the catalog (read-only until a command writes) and check the roots asked for:
    a root below which the catalog records nothing is bad input, not an empty answer. With
    ``storage``, open each root's storage too; a root that cannot be opened is set aside
    (the others are maintained, and :func:`exit_after` names it)."""
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


def exit_after(fleet: Fleet, failed: bool) -> NoReturn:
    """Exit 1 if some work ``failed`` or a root was set aside (each named on stderr: some
    work failed, the other roots were maintained), else 0."""
    for root, why in sorted(fleet.failed_roots.items()):
        click.echo(
            redact(f"error: root {root} was not maintained (some work failed): {why}"), err=True
        )
    sys.exit(EXIT_PROBLEMS if failed or fleet.failed_roots else 0)


def duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> timedelta | None:
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
            option, setting.name, callback=duration, help=setting.help, show_default=default
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


def policy_of(settings: Settings, options: dict[str, Any]) -> MaintenancePolicy:
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


def stores_of(fleet: Fleet, values: tuple[str, ...]) -> list[StoreKey] | None:
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

master_option = click.option(
    "--master",
    default="local[2]",
    help="Spark master for the job (SPARK_REMOTE, when set, makes it a Spark Connect client).",
)


def spark_options(command: F) -> F:
    """``--on-spark`` and ``--master``: run the pass's per-store work as Spark tasks."""
    command = master_option(command)
    return click.option(
        "--on-spark",
        is_flag=True,
        help="Run the per-store work as Spark tasks over the fleet (executors must reach "
        "the catalog and the storage; see docs/maintenance.md); wins over --processes.",
    )(command)


def spread_of(settings: Settings, options: dict[str, Any], command: str) -> Spread | None:
    """The Spark spread ``--on-spark`` asks for (the session started on ``--master``), or
    None: the pass runs on this host, in its processes or threads as
    :func:`~state_runtime.maintenance.host_processes.spread_for` decides."""
    if not options["on_spark"]:
        return None
    from state_runtime.maintenance.spark import SparkSpread
    from state_runtime.runtime.spark_session import spark_session

    spark = spark_session(options["master"], app_name=f"statestore-{command}")
    return SparkSpread(spark, settings.url)


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
@click.option(
    "--verbose",
    is_flag=True,
    help="On a failure, also print its full trace (always written to $STATE_LOG_FILE, else "
    "state-runtime-<uid>.log in the temporary folder).",
)
@click.pass_context
def main(ctx: click.Context, /, **kw: Any) -> None:
    """Maintain the state stores recorded in a catalog: snapshots, cleanup, validation."""
    show_warnings(kw["quiet"])
    roots = [canonical_root(r) for r in kw["roots"]] or None
    ctx.obj = Settings(kw.get("catalog_url") or catalog_url(), roots, kw["quiet"], kw["policy"])


def _json_asked() -> bool:
    return bool(click.get_current_context().params.get("as_json"))


def emit(
    value: T,
    printer: Callable[[Console, T], None] | None,
    as_json: Callable[[T], Any] | None = None,
) -> None:
    """A command's answer: with ``--json`` the whole ``value`` as JSON (through ``as_json``
    when given), else ``printer``'s tables and lines (None: the parts were printed as they
    came, :func:`emit_part`)."""
    if _json_asked():
        echo_json(value if as_json is None else as_json(value))
    elif printer is not None:
        printer(click.get_current_context().find_root().obj.console, value)


def emit_part(value: T, printer: Callable[[Console, T], None]) -> None:
    """A part of an answer that :func:`emit` gives whole at the end: printed now for a person
    (a pass's report as soon as the pass ends), nothing with ``--json``."""
    if not _json_asked():
        printer(click.get_current_context().find_root().obj.console, value)
