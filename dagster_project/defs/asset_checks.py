"""Asset checks on the checkpoint files, evaluated together by one validation pass.

Fleet-wide: lineage validity (blocking: a failure stops the cleanup of the same run),
retention within policy, snapshot lag and orphan growth, each naming the stores that fail.
Per store, one evaluation per partition of ``state_checkpoints`` (one partition per store,
so each store's page shows its own): ``store_status``, failing with ERROR for a broken store
and WARN for a degraded or unknown one, and ``commit_lag``, the store's freshness, failing with
WARN when its stream has not committed for ``commit_lag_warn``; each with the store, its
status, the reason and since when, and its commit lag in the metadata.
"""

import warnings
from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
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
    MaintenancePolicy,
    Severity,
    StoreReport,
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
) -> Iterator[AssetCheckEvaluation]:
    """One validation pass (recorded in the catalog) evaluates every check of the registry;
    the ones selected are reported."""
    with maintenance.run(context) as run:
        report = run_checks(run.fleet, run.policy, progress=run.progress, workers=run.workers)
    selected = {key.name for key in context.selected_asset_check_keys}
    known = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
    for check in CHECKS:
        if check.per_store and check.name.value in selected:
            for store in report.health:
                if str(store.key) in known:
                    yield store_evaluation(check, store, run.policy)
    blocking = {check.name for check in CHECKS if check.blocking}
    for outcome in report.outcomes:
        if outcome.name.value not in selected:
            continue
        # An evaluation, not an AssetCheckResult: a result looks up the target's latest
        # materialization, which fails in an unpartitioned run once the stores' partitions
        # have materializations (Dagster 1.13); blocking is carried by the evaluation itself.
        yield AssetCheckEvaluation(
            asset_key=state_checkpoints.key,
            check_name=outcome.name.value,
            passed=outcome.passed,
            severity=_severity(outcome.severity),
            description=outcome.summary,
            metadata=check_metadata(outcome),
            blocking=outcome.name in blocking,
        )


def _severity(severity: Severity) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if severity is Severity.ERROR else AssetCheckSeverity.WARN


def store_evaluation(
    check: CheckInfo, report: StoreReport, policy: MaintenancePolicy
) -> AssetCheckEvaluation:
    """A per-store check's evaluation of one store, on its partition."""
    assert check.judge is not None
    verdict = check.judge(report, policy)
    return AssetCheckEvaluation(
        asset_key=state_checkpoints.key,
        check_name=check.name.value,
        partition=str(report.key),
        passed=verdict.passed,
        severity=_severity(verdict.severity),
        description=verdict.summary,
        metadata=status_metadata(report),
    )
