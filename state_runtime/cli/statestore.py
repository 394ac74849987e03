"""The ``statestore`` command: the group of :mod:`state_runtime.cli.group` with every family's
commands, the passes (:mod:`.passes`), inspection (:mod:`.inspection`, :mod:`.history`),
recovery (:mod:`.recovery`) and the catalog's own (:mod:`.catalog`).

Every command takes ``--json`` (the whole report, see :mod:`state_runtime.cli.jsonable`).
"""

from __future__ import annotations

from state_runtime.cli.catalog import catalog
from state_runtime.cli.group import main
from state_runtime.cli.history import history, metrics
from state_runtime.cli.inspection import explain, health, schema_check
from state_runtime.cli.passes import maintain, validate
from state_runtime.cli.recovery import (
    reconcile_command,
    relocate,
    repair,
    repartition,
    resolve,
    restore,
)

__all__ = ["main"]

for command in (
    maintain,
    validate,
    health,
    history,
    explain,
    metrics,
    schema_check,
    repair,
    resolve,
    restore,
    repartition,
    reconcile_command,
    relocate,
    catalog,
):
    main.add_command(command)
main.add_command(health, name="status")
