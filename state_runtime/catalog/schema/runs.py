"""The kinds and outcomes of a maintenance run, as ``maintenance_runs`` stores them: apart from
:mod:`.tables` (which re-exports them) so that :mod:`.predicates`, whose conditions the
tables' indexes take, can name them without an import cycle."""

from __future__ import annotations

from enum import StrEnum


class RunKind(StrEnum):
    SNAPSHOT = "snapshot"
    CLEANUP = "cleanup"
    VALIDATE = "validate"
    RECONCILE = "reconcile"
    RESTORE = "restore"
    REPARTITION = "repartition"


class RunOutcome(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"  # its process died or went silent; closed by a later pass
