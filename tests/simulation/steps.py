"""Replaying a fixed sequence of simulation steps: how each shrunk counterexample is kept;
the steps and sequences the found cases and the simulations share."""

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


def run(
    changes: dict[int, dict[str, int | None]], *, step: int = 0, fail: str | None = None
) -> Step:
    """The machine's ``run`` rule: a batch with ``changes`` by store (``step``: 0 the next
    batch, -1 a replay of the last, -2 an older one, 1 a gap), failing at ``fail``."""
    return ("run", {"step": step, "changes": changes, "fail": fail, "fail_at": 0})


ONLY_THE_FIRST_STORE = {0: {"a": 1}}
"""A batch in which store 1 changes nothing (an idle version)."""

AROUND_A_REPARTITION: list[Step] = [
    run({0: {"a": 2}, 1: {"c": 5, "b": None}}),
    ("repartition", {}),
    run({0: {"a": 1}, 2: {"d": 3}}),
    run({1: {"b": -1}}),
    ("snapshot", {"zero": True}),
    ("cleanup", {"zero": True}),
    ("validate", {"zero": False}),
    ("restore", {"back": 2, "allow_lost_state": False, "zero": True}),
    ("restore", {"back": 1, "allow_lost_state": False, "zero": True}),
]
"""Batches on 2 partitions, a repartition to 3, batches on the new layout (one store idle),
snapshot and cleanup at zero windows, validation, and restores to the repartitioned batch and
before it: the library and the runtime simulations both replay it."""
