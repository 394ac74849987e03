"""``statestore``: maintenance of state stores from the command line (see docs/maintenance.md)."""

from state_runtime.cli.commands import main

__all__ = ["main"]
