"""Asset checks on the checkpoint files, evaluated together by one validation pass.

Fleet-wide: lineage validity (blocking: a failure stops the cleanup of the same run),
retention within policy, snapshot lag and orphan growth, each naming the stores that fail.
Per store: ``store_status``, one evaluation per partition of ``state_checkpoints`` (one
partition per store), failing with ERROR for a broken store and WARN for a degraded one,
with the store, its status, the reason and since when in the metadata.
"""

import warnings
from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    PreviewWarning,
    multi_asset_check,
)

from dagster_project.defs.assets import POOL, state_checkpoints
from dagster_project.defs.metadata import check_metadata, status_metadata
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.maintenance import (
    CHECKS,
    CheckInfo,
    CheckName,
    Severity,
    StoreReport,
    StoreStatus,
    run_checks,
)


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
) -> Iterator[AssetCheckResult | AssetCheckEvaluation]:
    """One validation pass (recorded in the catalog) evaluates every check of the registry;
    the ones selected are reported."""
    with maintenance.run(context) as run:
        report = run_checks(run.fleet, run.policy, progress=run.progress, workers=run.workers)
    selected = {key.name for key in context.selected_asset_check_keys}
    if CheckName.STORE_STATUS.value in selected:
        known = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
        for store in report.health:
            if str(store.key) in known:
                yield store_evaluation(store)
    for outcome in report.outcomes:
        if outcome.name.value not in selected:
            continue
        yield AssetCheckResult(
            asset_key=state_checkpoints.key,
            check_name=outcome.name.value,
            passed=outcome.passed,
            severity=(
                AssetCheckSeverity.ERROR
                if outcome.severity is Severity.ERROR
                else AssetCheckSeverity.WARN
            ),
            description=outcome.summary,
            metadata=check_metadata(outcome),
        )


def store_evaluation(report: StoreReport) -> AssetCheckEvaluation:
    """The ``store_status`` evaluation of one store, on its partition."""
    status = report.status.status
    return AssetCheckEvaluation(
        asset_key=state_checkpoints.key,
        check_name=CheckName.STORE_STATUS.value,
        partition=str(report.key),
        passed=status is StoreStatus.HEALTHY,
        severity=(
            AssetCheckSeverity.ERROR if status is StoreStatus.BROKEN else AssetCheckSeverity.WARN
        ),
        description=str(report.status),
        metadata=status_metadata(report),
    )
