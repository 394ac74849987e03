"""Recovery: ``repair``, ``resolve``, ``restore``, ``repartition``, ``reconcile`` and
``relocate``, with their printers."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from state_runtime.cli.exits import (
    EXIT_PROBLEMS,
    EXIT_USAGE,
    fail,
)
from state_runtime.cli.group import (
    RETENTION,
    Settings,
    duration,
    emit,
    exit_after,
    json_option,
    master_option,
    open_fleet,
    policy_of,
    policy_options,
    store_option,
    stores_of,
)
from state_runtime.cli.printing import SHOWN, print_leftovers, print_lines, print_rows
from state_runtime.maintenance import (
    DamageReport,
    Fate,
    RebuildPlan,
    ReconcileReport,
    RelocationReport,
    RepairReport,
    RestorePlan,
    beyond_repair,
    canonical_root,
    damaged_files,
    plan_restore,
    reconcile,
    relocate_root,
    repair_pass,
    restore_query,
)

if TYPE_CHECKING:
    from state_runtime.maintenance.repartition import RepartitionPlan


@click.command()
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
    policy = policy_of(settings, kw)
    with open_fleet(settings, storage=True) as fleet:
        only = stores_of(fleet, kw["stores"])
        done: dict[str, Any] = {"dry_run": kw["dry_run"]}
        if kw["dry_run"]:
            found = damaged_files(fleet, policy, only)
            done["rebuild"] = RebuildPlan(found.of(Fate.REPAIRABLE))
            done["beyond_repair"] = found.beyond_repair()
        else:
            done["report"] = repair_pass(fleet, policy, only=only, progress=settings.progress)
            done["beyond_repair"] = beyond_repair(fleet, policy, only)
    emit(done, print_repair, repair_json)
    left = done["beyond_repair"]
    failed = not kw["dry_run"] and bool(done["report"].failed)
    exit_after(fleet, failed or bool(left.damages or left.other))


@click.command()
@click.option("--store", "stores", multiple=True, required=True, metavar="[ROOT#]OP/PART/NAME")
@click.option("--reason", required=True, help="Why the problems are resolved (recorded).")
@json_option
@click.pass_obj
def resolve(settings: Settings, /, **kw: Any) -> None:
    """Resolve a store's open problems by hand (recorded with the reason): the store is
    cleaned again. The next validation reopens whatever it still finds."""
    resolved: dict[str, int] = {}
    with open_fleet(settings) as fleet:
        for key in stores_of(fleet, kw["stores"]) or []:
            count = fleet.catalog.resolve_problems(key, f"resolved by hand: {kw['reason']}")
            resolved[str(key)] = count
    emit({"resolved": resolved, "reason": kw["reason"]}, print_resolved)


@click.command()
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
    with open_fleet(settings) as fleet:
        plan = plan_restore(
            fleet,
            settings.roots[0],
            kw["query_id"],
            kw["batch_id"],
            spark_checkpoint=spark,
            allow_lost_state=kw["allow_lost_state"],
        )
        if not kw["dry_run"]:
            plan = restore_query(fleet, plan, policy_of(settings, {}))
    emit(plan, print_restore)


@click.command()
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
    callback=duration,
    help="Refuse while the query committed a batch more recently than this (default 60s).",
)
@master_option
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
    from state_runtime.runtime.spark_session import spark_session

    if kw["spark_checkpoint"] and kw["no_spark_checkpoint"]:
        fail(EXIT_USAGE, "--spark-checkpoint and --no-spark-checkpoint exclude each other")
    settings.roots = [canonical_root(root)]
    with open_fleet(settings, storage=True) as fleet:
        plan = run_repartition(  # Spark starts once the catalog-only checks pass
            lambda: spark_session(kw["master"], app_name="statestore-repartition"),
            fleet,
            settings.roots[0],
            kw["query_id"],
            kw["partitions"],
            operator_id=kw["operator_id"],
            spark_checkpoint="" if kw["no_spark_checkpoint"] else kw["spark_checkpoint"],
            dry_run=kw["dry_run"],
            policy=policy_of(settings, {}),
            idle=kw["idle"],
            progress=settings.progress,
        )
    emit(plan, print_repartition)


@click.command(name="reconcile")
@click.option("--dry-run/--record", default=False, help="Only report unknown files.")
@click.option(
    "--min-age", callback=duration, help="Skip younger files.", show_default="--min-window"
)
@json_option
@policy_options(*RETENTION, "min_window")
@click.pass_obj
def reconcile_command(settings: Settings, /, **kw: Any) -> None:
    """List storage and record the files the catalog does not know (a rare sweep)."""
    policy = policy_of(settings, kw)
    with open_fleet(settings, storage=True) as fleet:
        report = reconcile(
            fleet,
            policy,
            dry_run=kw["dry_run"],
            min_age=kw["min_age"],
            progress=settings.progress,
        )
    emit(report, print_reconcile)
    exit_after(fleet, bool(report.unreadable))


@click.command()
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
    with open_fleet(settings) as fleet:
        report = relocate_root(fleet.catalog, settings.roots[0], new, dry_run=kw["dry_run"])
    emit(report, print_relocation)
    sys.exit(EXIT_PROBLEMS if report.missing else 0)


def print_resolved(console: Console, done: dict[str, Any]) -> None:
    for key, count in done["resolved"].items():
        console.print(f"{key}: {count} open problem(s) resolved")


def print_repair(console: Console, done: dict[str, Any]) -> None:
    """What repair did or (a dry run) would do, then what it cannot fix."""
    if done["dry_run"]:
        print_rebuild(console, done["rebuild"])
    else:
        print_repairs(console, done["report"])
    print_beyond_repair(console, done["beyond_repair"])


def repair_json(done: dict[str, Any]) -> dict[str, Any]:
    """Repair's answer as JSON: each damaged file with its fate and next command."""
    left: DamageReport = done["beyond_repair"]
    shown = {k: v for k, v in done.items() if k not in ("rebuild", "beyond_repair")}
    if "rebuild" in done:
        shown["rebuild"] = [d.details() for d in done["rebuild"].damaged]
    return shown | {"beyond_repair": [d.details() for d in left.damages] + list(left.other)}


def print_reconcile(console: Console, report: ReconcileReport) -> None:
    """The report's summary, then each file it recorded or could not read."""
    console.print(report.summary(), markup=False, soft_wrap=True)
    print_lines(console, report.rows())
    print_leftovers(console, report.leftovers)


def print_relocation(console: Console, report: RelocationReport) -> None:
    """The report's summary, then each committed file missing at the new root."""
    console.print(report.summary(), markup=False, soft_wrap=True)
    print_lines(console, report.rows())
    if not report.executed and not report.missing:
        console.print("Run with --execute to record the new root.")


def print_rebuild(console: Console, plan: RebuildPlan) -> None:
    """A repair's dry run: the plan's summary, then each damaged snapshot it rebuilds."""
    if plan.damaged:
        console.print(plan.summary(), markup=False)
    print_rows(console, plan.rows())


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
    """The report's summary, then each snapshot it looked at."""
    console.print(report.summary(), markup=False)
    print_rows(console, report.rows())


def print_restore(console: Console, plan: RestorePlan) -> None:
    """What a restore did, or (a dry run) will do: the plan's summary, the stores whose state
    is lost, then what happens to the superseded files and the Spark checkpoint."""
    done = plan.executed
    console.print(plan.summary(), soft_wrap=True, markup=False)
    batches = sorted({e.batch_id for e in plan.superseded if e.batch_id > plan.batch_id})
    if batches:
        console.print(
            f"  superseded: batch(es) {batches[0]}-{batches[-1]}; their files become orphans "
            "that cleanup deletes after the grace period (the ledger names this restore)",
            soft_wrap=True,
        )
    print_rows(console, [row for row in plan.rows() if row["lost"]])
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
    else:
        console.print("Run with --execute to restore.")


def print_repartition(console: Console, plan: RepartitionPlan) -> None:
    """What a repartition did, or (a dry run) will do: the plan's summary, then rows and bytes
    per new partition."""
    console.print(plan.summary(), soft_wrap=True, markup=False)
    print_rows(console, plan.rows())
    if plan.executed:
        console.print(
            f"  switched in one transaction; old files are superseded and go by retention "
            f"(the ledger names run {plan.run_id}). Restart the query with "
            f"num_partitions={plan.num_partitions}: it resumes at batch {plan.batch_id + 1}",
            soft_wrap=True,
        )
    else:
        console.print("Run with --execute to repartition.")
