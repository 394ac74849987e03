"""``statestore``: maintenance of state stores from the command line (see docs/maintenance.md).

It needs the ``cli`` extra (click, rich): :func:`entry`, the installed command, says so when it
is missing. ``from state_runtime.cli import main`` gives the click group itself.
"""

from __future__ import annotations

import sys
from typing import Any

from state_runtime.errors import extra_hint

__all__ = ["entry", "main"]

CLI_PACKAGES = ("click", "rich")


def entry() -> None:
    """The ``statestore`` command."""
    try:
        from state_runtime.cli.statestore import main
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in CLI_PACKAGES:
            raise
        print(f"error: statestore needs {extra_hint('cli', exc.name)}", file=sys.stderr)
        sys.exit(2)
    main()


def __getattr__(name: str) -> Any:
    if name == "main":  # imported on use: importing the package needs no extra
        from state_runtime.cli.statestore import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
