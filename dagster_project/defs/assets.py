"""Assets: the checkpoint files (written by the streams) and the maintenance that keeps them.

``state_checkpoints`` stands for the files the streaming queries write, one partition per
store (defined in ``checkpoints.py``); Dagster never writes the files, but every validation
or health run records each store's state on its partition (status and figures as metadata:
a materialization for a sound store, an observation for a broken one, whose partition
``state_store_record_job`` fails), so each partition shows its latest state and history.
The maintenance assets each run one pass of ``state_runtime.maintenance``.
"""

from dagster import (
    AssetExecutionContext,
    Config,
    MaterializeResult,
    asset,
)
from pydantic import Field

from dagster_project.defs.checkpoints import GROUP, POOL, state_checkpoints
from dagster_project.defs.metadata import (
    cleanup_metadata,
    rebuild_metadata,
    reconcile_metadata,
    repair_metadata,
    snapshot_metadata,
)
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.store_events import changed_store_events, fleet_metadata
from state_runtime.catalog import StoreKey
from state_runtime.maintenance import (
    HealthSpool,
    StoreNames,
    cleanup_pass,
    rebuild_plan,
    reconcile,
    repair_pass,
    snapshot_pass,
    store_report_pages,
)


class StoresConfig(Config):
    """``stores``: only these stores (their partition keys, ``<query>/<op>/<partition>/<name>``,
    or full keys ``<root>#<op>/<partition>/<name>``); empty: all."""

    stores: list[str] = Field(
        default=[],
        description="Only these stores (<query>/<op>/<partition>/<name> as the partitions "
        "name them, or <root>#<op>/<partition>/<name>); empty: all.",
    )

    def only(self, names: StoreNames) -> list[StoreKey] | None:
        return [names.key(s) for s in self.stores] or None


class CleanupConfig(StoresConfig):
    """``dry_run`` (default): report what would be deleted and why, delete nothing."""

    dry_run: bool = Field(default=True, description="Report what would go; delete nothing.")


class RepairConfig(StoresConfig):
    """``dry_run`` (default): list the damaged snapshots, change nothing."""

    dry_run: bool = Field(default=True, description="List what would be rebuilt; change nothing.")


class HealthConfig(Config):
    """``observe_stores``: record each store's status and figures on its
    ``state_checkpoints`` partition (a materialization, or an observation when broken)."""

    observe_stores: bool = True


class ReconcileConfig(Config):
    dry_run: bool = False


@asset(group_name=GROUP, deps=[state_checkpoints], pool=POOL, kinds={"python"})
def state_snapshots(
    context: AssetExecutionContext, config: StoresConfig, maintenance: MaintenanceResource
) -> MaterializeResult:  # type: ignore[type-arg]
    """Snapshots of every store whose delta chain (or cold-load cost) passed the threshold."""
    with maintenance.run(context) as run:
        report = snapshot_pass(
            run.fleet,
            run.policy,
            only=config.only(run.names),
            progress=run.progress,
            spread=run.spread,
        )
    for failed in report.failed:
        context.log.error(f"snapshot of {failed.key} failed: {failed.error}")
    return MaterializeResult(metadata=snapshot_metadata(report, run.names))


@asset(group_name=GROUP, deps=[state_checkpoints], pool=POOL, kinds={"python"})
def state_retention_cleanup(
    context: AssetExecutionContext, config: CleanupConfig, maintenance: MaintenanceResource
) -> MaterializeResult:  # type: ignore[type-arg]
    """Deletes what retention allows (a dry run unless ``dry_run: false``); every deletion
    goes into the catalog's ledger with its reason. Stores with open validation problems are
    held (listed in the metadata): nothing they committed is deleted."""
    with maintenance.run(context) as run:  # a refusal fails the step with its paragraph
        report = cleanup_pass(
            run.fleet,
            run.policy,
            dry_run=config.dry_run,
            only=config.only(run.names),
            progress=run.progress,
            spread=run.spread,
        )
    for path, error in report.failed.items():
        context.log.warning(f"could not delete {path}: {error} (the next run retries)")
    return MaterializeResult(metadata=cleanup_metadata(report, run.policy.parameters(), run.names))


@asset(group_name=GROUP, deps=[state_checkpoints], pool=POOL, kinds={"python"})
def state_snapshot_repair(
    context: AssetExecutionContext, config: RepairConfig, maintenance: MaintenanceResource
) -> MaterializeResult:  # type: ignore[type-arg]
    """Rebuilds damaged snapshots from their intact deltas (a dry run unless ``dry_run:
    false``): each new snapshot is verified before the damaged file is recorded and removed,
    and replaces the deltas only once written and verified again."""
    with maintenance.run(context) as run:
        if config.dry_run:
            plan = rebuild_plan(run.fleet, run.policy, config.only(run.names))
            return MaterializeResult(metadata=rebuild_metadata(plan, run.names))
        report = repair_pass(
            run.fleet, run.policy, only=config.only(run.names), progress=run.progress
        )
    for failed in report.failed:
        context.log.error(f"repair of {failed.key}/{failed.path} {failed.status}: {failed.detail}")
    return MaterializeResult(metadata=repair_metadata(report, run.names))


@asset(group_name=GROUP, deps=[state_checkpoints], kinds={"python"})
def state_store_health(
    context: AssetExecutionContext, config: HealthConfig, maintenance: MaintenanceResource
) -> MaterializeResult:  # type: ignore[type-arg]
    """Every store's status and figures from the catalog: fleet totals here (broken, degraded
    and unknown stores among them) with a table of the stores, and each store's status,
    figures and schema history on its ``state_checkpoints`` partition when they changed since
    the last report (a materialization or, broken, an observation: its history). The
    validation job records the same after validating."""
    with maintenance.run(context) as run:
        health = HealthSpool.of(store_report_pages(run.fleet, run.policy))
        if config.observe_stores:
            partitions = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
            for changed in changed_store_events(
                context.instance,
                run.fleet.catalog,
                health.pages(),
                run.names,
                run.policy,
                partitions,
            ):
                for event in changed.states:
                    context.log_event(event)
                changed.logged()
    try:
        return MaterializeResult(metadata=fleet_metadata(health.pages(), run.names))
    finally:
        health.close()


@asset(group_name=GROUP, deps=[state_checkpoints], pool=POOL, kinds={"python"})
def state_reconciliation(
    context: AssetExecutionContext, config: ReconcileConfig, maintenance: MaintenanceResource
) -> MaterializeResult:  # type: ignore[type-arg]
    """The rare sweep that lists storage and records files the catalog does not know."""
    with maintenance.run(context) as run:
        report = reconcile(run.fleet, run.policy, dry_run=config.dry_run, progress=run.progress)
    return MaterializeResult(metadata=reconcile_metadata(report))
