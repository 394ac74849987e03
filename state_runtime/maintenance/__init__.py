"""Maintenance of state stores: snapshots, cleanup, validation, health and reconciliation.

The library the ``statestore`` CLI and the Dagster code location both call. Every pass works
from the catalog's inventory and lists no storage, except the rare reconciliation sweep. See
``docs/maintenance.md``.
"""

from state_runtime.catalog import RecoveryCost
from state_runtime.maintenance.attempts import AttemptSweepReport, sweep_attempts
from state_runtime.maintenance.checks import (
    CHECKS,
    CheckInfo,
    CheckName,
    CheckOutcome,
    ChecksReport,
    lineage_check,
    orphan_growth_check,
    retention_check,
    run_checks,
    snapshot_lag_check,
)
from state_runtime.maintenance.cleanup import (
    CleanupReport,
    HeldStore,
    cleanup_pass,
    held_stores,
    plan_cleanup,
)
from state_runtime.maintenance.damage import (
    Damage,
    DamageReport,
    Fate,
    classify,
    damaged_files,
)
from state_runtime.maintenance.explain import FileExplanation, explain_file, locate_file
from state_runtime.maintenance.fleet import (
    Fleet,
    canonical_root,
    default_owner,
    format_store_key,
    parse_store_key,
)
from state_runtime.maintenance.health import (
    FleetTotals,
    HealthSpool,
    StoreReport,
    health_rows,
    health_summary,
    iter_store_reports,
    store_report_pages,
    store_reports,
)
from state_runtime.maintenance.leftovers import LeftoverReport, sweep_leftovers
from state_runtime.maintenance.policy import MaintenancePolicy, format_duration, parse_duration
from state_runtime.maintenance.progress import SILENT, CallbackProgress, Progress
from state_runtime.maintenance.reconcile import ReconcileReport, reconcile
from state_runtime.maintenance.relocate import RelocationReport, relocate_root
from state_runtime.maintenance.repair import (
    RebuildPlan,
    RepairOutcome,
    RepairReport,
    RepairStatus,
    beyond_repair,
    damaged_snapshots,
    rebuild_plan,
    repair_pass,
)
from state_runtime.maintenance.restore import (
    RestorePlan,
    newest_intact_batch,
    plan_restore,
    restore_query,
)
from state_runtime.maintenance.schema_changes import (
    SchemaChangeRow,
    SchemaCheck,
    check_schema_change,
    schema_changes,
)
from state_runtime.maintenance.snapshots import (
    DueStore,
    SnapshotOutcome,
    SnapshotReport,
    SnapshotStatus,
    due_for_snapshot,
    snapshot_pass,
)
from state_runtime.maintenance.store_names import StoreNames
from state_runtime.maintenance.validation import (
    Finding,
    Severity,
    StoreValidation,
    ValidationReport,
    validate_stores,
)
from state_runtime.status import Status, StoreStatus, store_status

__all__ = [
    "CHECKS",
    "SILENT",
    "AttemptSweepReport",
    "CallbackProgress",
    "CheckInfo",
    "CheckName",
    "CheckOutcome",
    "ChecksReport",
    "CleanupReport",
    "Damage",
    "DamageReport",
    "DueStore",
    "Fate",
    "FileExplanation",
    "Finding",
    "Fleet",
    "FleetTotals",
    "HeldStore",
    "LeftoverReport",
    "MaintenancePolicy",
    "Progress",
    "ReconcileReport",
    "RecoveryCost",
    "RelocationReport",
    "RebuildPlan",
    "RepairOutcome",
    "RepairReport",
    "RepairStatus",
    "RestorePlan",
    "SchemaChangeRow",
    "SchemaCheck",
    "Severity",
    "SnapshotOutcome",
    "SnapshotReport",
    "SnapshotStatus",
    "Status",
    "StoreNames",
    "StoreReport",
    "StoreStatus",
    "StoreValidation",
    "ValidationReport",
    "beyond_repair",
    "canonical_root",
    "check_schema_change",
    "cleanup_pass",
    "classify",
    "damaged_files",
    "damaged_snapshots",
    "default_owner",
    "due_for_snapshot",
    "explain_file",
    "locate_file",
    "format_duration",
    "format_store_key",
    "health_rows",
    "health_summary",
    "HealthSpool",
    "iter_store_reports",
    "held_stores",
    "lineage_check",
    "orphan_growth_check",
    "parse_duration",
    "parse_store_key",
    "plan_cleanup",
    "plan_restore",
    "reconcile",
    "relocate_root",
    "rebuild_plan",
    "repair_pass",
    "newest_intact_batch",
    "restore_query",
    "retention_check",
    "run_checks",
    "schema_changes",
    "snapshot_lag_check",
    "snapshot_pass",
    "store_report_pages",
    "store_reports",
    "store_status",
    "sweep_attempts",
    "sweep_leftovers",
    "validate_stores",
]
