"""What hypothesis draws for the simulation's rules (``machine.py``): each rule's arguments
and how many shares of the draw of a step's rule each rule gets."""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from tests.simulation.model import KEYS
from tests.simulation.platform import LAYOUTS

changes_of_a_store = st.dictionaries(
    st.sampled_from(KEYS), st.one_of(st.none(), st.integers(-3, 5)), min_size=1, max_size=3
)
batches = st.dictionaries(
    st.integers(0, max(LAYOUTS) - 1), changes_of_a_store, max_size=max(LAYOUTS)
)
"""A batch's input: every store, some or none of them changing (a partition beyond the
query's layout receives nothing)."""
failures = st.sampled_from([None, None, None, None, "task", "sink", "driver"])
clock_steps = st.sampled_from(
    [timedelta(minutes=-30), timedelta(minutes=10), timedelta(hours=2), timedelta(days=8)]
)
storage_clock_steps = st.sampled_from(
    [
        timedelta(minutes=-30),
        timedelta(hours=-2),
        timedelta(days=-8),
        timedelta(minutes=10),
        timedelta(hours=2),
        timedelta(days=8),
    ]
)
"""The storage's clock is a file server's, apart from the hosts': it may be far behind too
(files written now look older than the grace)."""
stages = st.sampled_from(["begun", "written"])
"""Where in a batch another step runs: after its intent, or after its tasks wrote."""
CHORES = ("snapshot", "cleanup", "reconcile", "sweep_attempts")
"""The maintenance passes that may race a batch (the machine's rules of those names)."""


M = TypeVar("M", bound=RuleBasedStateMachine)


WEIGHTS = {
    "run": 8,
    "raced_batch": 3,
    "restore": 3,
    "cleanup": 3,
    "snapshot": 2,
    "validate": 2,
    "zombie": 3,
    "damage": 3,
    "repartition": 2,
}
"""How many shares of hypothesis's draw each rule gets (any other rule: one). Hypothesis draws
a step's rule evenly from the machine's rules, so batches were 4 % of steps and the
compositions that need several of them (a restore after batches, cleanup and snapshots
between them, a raced batch) were rare in ``make test``'s derandomized runs."""


def weighted(machine: type[M]) -> type[M]:
    """Give each rule of :data:`WEIGHTS` its shares: ``weight - 1`` more names for the same
    rule (hypothesis lists a rule once per name it finds on the class, prints a step by the
    rule's own name, so the steps replay unchanged, and turns a rule's copies on and off
    together in its swarm testing)."""
    for name, weight in WEIGHTS.items():
        for share in range(1, weight):
            setattr(machine, f"{name}_share_{share}", getattr(machine, name))
    return machine
