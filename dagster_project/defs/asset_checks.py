"""Asset checks on the checkpoint files, evaluated together by one validation pass.

Fleet-wide: lineage validity (blocking: a failure stops the cleanup of the same run),
retention within policy, snapshot lag and orphan growth, each naming the stores that fail.
Per store, one evaluation per partition of ``state_checkpoints`` (one partition per store,
so each store's page shows its own; the worst store last, see ``store_events.py``):
``store_status``, failing with ERROR for a broken store
and WARN for a degraded or unknown one, and ``commit_lag``, the store's freshness, failing with
WARN when its stream has not committed for ``commit_lag_warn``; each with the store, its
status, the reason and since when, and its commit lag in the metadata.
"""

import warnings
from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckSpec,
    PreviewWarning,
    multi_asset_check,
)

from dagster_project.defs.checkpoints import POOL, state_checkpoints
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.store_events import (
    changed_store_events,
    fleet_evaluation,
    fleet_materialization,
)
from state_runtime.maintenance import CHECKS, CheckInfo, run_checks


def _spec(check: CheckInfo) -> AssetCheckSpec:
    """The Dagster spec of a library check; a per-store one has a partition per store."""
    return AssetCheckSpec(
        check.name.value,
        asset=state_checkpoints.key,
        description=check.description,
        blocking=check.blocking,
        partitions_def=state_stores if check.per_store else None,
    )


with warnings.catch_warnings():  # checks on partitions are a Dagster preview, used deliberately
    warnings.simplefilter("ignore", PreviewWarning)
    SPECS = [_spec(check) for check in CHECKS]


@multi_asset_check(
    specs=SPECS,
    pool=POOL,
    can_subset=True,
)
def state_checkpoint_checks(
    context: AssetCheckExecutionContext, maintenance: MaintenanceResource
) -> Iterator[AssetCheckEvaluation]:
    """One validation pass (recorded in the catalog) evaluates every check of the registry;
    the ones selected are reported. Each store's state and the fleet's totals are recorded
    here too, before any fleet-wide check is reported: a failing blocking check stops what
    comes downstream, never the report of the failure. The stores' reports are read back a
    page at a time (the report keeps them on disk), each page's events logged as it goes."""
    selected = {key.name for key in context.selected_asset_check_keys}
    partitions = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
    with maintenance.run(context) as run:
        report = run_checks(run.fleet, run.policy, progress=run.progress, spread=run.spread)
        log_event = context.op_execution_context.log_event
        log_event(fleet_materialization(report.health.pages(), run.names))
        for changed in changed_store_events(
            context.instance,
            run.fleet.catalog,
            report.health.pages(),
            run.names,
            run.policy,
            partitions,
            selected,
        ):
            for event in changed.states:
                log_event(event)
            yield from changed.evaluations
            changed.logged()
    report.health.close()
    for outcome in report.outcomes:
        if outcome.name.value in selected:
            yield fleet_evaluation(outcome, run.names)
