"""Replaying a fixed sequence of simulation steps: how each shrunk counterexample is kept."""

from __future__ import annotations

from typing import Any

from tests.simulation.machine import PlatformMachine

Step = tuple[str, dict[str, Any]]


def replay(
    steps: list[Step], machine_type: type[PlatformMachine] = PlatformMachine
) -> PlatformMachine:
    """Run ``steps`` (rule name, arguments) after the first batch, checking every invariant
    after each, then the machine's teardown (the query must go on)."""
    machine = machine_type()
    try:
        machine.first_batch()
        machine.check()
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            machine.check()
    except BaseException:
        machine.platform.close()
        raise
    machine.teardown()
    return machine
