"""Asset checks on the checkpoint files: lineage validity, retention within policy, snapshot
lag and orphan growth, evaluated together by one validation pass."""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    multi_asset_check,
)

from dagster_project.defs.assets import POOL, state_checkpoints
from dagster_project.defs.metadata import check_metadata
from dagster_project.defs.resources import (
    CheckpointStorageResource,
    MaintenancePolicyResource,
    StateCatalogResource,
    open_fleet,
)
from state_runtime.maintenance import CallbackProgress, CheckName, Severity, run_checks

DESCRIPTIONS = {
    CheckName.LINEAGE: (
        "Every retained committed version is loadable: its files exist with the recorded "
        "sizes and checksums, its lineage is contiguous, the commit log is linear."
    ),
    CheckName.RETENTION: (
        "The retention keeps at least 2 versions and a window no shorter than the minimum, "
        "and cleanup keeps up (nothing stays deletable for long)."
    ),
    CheckName.SNAPSHOT_LAG: "Deltas since each store's last snapshot stay under the thresholds.",
    CheckName.ORPHAN_GROWTH: "Orphan files do not pile up between validations.",
}


@multi_asset_check(
    specs=[
        AssetCheckSpec(name.value, asset=state_checkpoints.key, description=text)
        for name, text in DESCRIPTIONS.items()
    ],
    pool=POOL,
    can_subset=True,
)
def state_checkpoint_checks(
    context: AssetCheckExecutionContext,
    state_catalog: StateCatalogResource,
    checkpoint_storage: CheckpointStorageResource,
    maintenance_policy: MaintenancePolicyResource,
) -> Iterator[AssetCheckResult]:
    """One validation pass (recorded in the catalog) evaluates the four checks; the ones
    selected are reported."""
    progress = CallbackProgress(
        lambda what, done, total: context.log.info(f"{what}: {done}/{total}")
    )
    with open_fleet(state_catalog, checkpoint_storage, f"dagster:{context.run.run_id}") as fleet:
        report = run_checks(
            fleet,
            maintenance_policy.policy(),
            progress=progress,
            workers=maintenance_policy.workers,
        )
    selected = {key.name for key in context.selected_asset_check_keys}
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
