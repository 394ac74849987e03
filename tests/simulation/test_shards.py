"""The shards' own contract (shards.py): a failing run in any shard, in its own process, fails
the whole with hypothesis's shrunk steps and how to run that shard again."""

from __future__ import annotations

import os
import re

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.simulation.shards import run_shards


class BreaksInOneShard(RuleBasedStateMachine):
    """Fails only in the process running shard 1 (its class name says which shard it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @rule(amount=st.integers(0, 3))
    def add(self, amount: int) -> None:
        self.total += amount

    @invariant()
    def small(self) -> None:
        shard_one = type(self).__name__.endswith("Shard1")
        assert not (shard_one and self.total > 4), f"total {self.total} in {os.getpid()}"


def test_a_failing_shard_fails_the_whole_with_its_steps() -> None:
    outcome = run_shards(3, 20, 10, processes=2, machine_type=BreaksInOneShard)
    assert outcome.processes == 2 and len(outcome.shards) == 3
    [failure] = outcome.failures
    assert failure.startswith("shard 1 (again: python -m tests.simulation.shards --shard 1)")
    found = re.search(r"AssertionError: total \d+ in (\d+)", failure)
    assert found is not None, failure
    assert int(found.group(1)) != os.getpid()  # run in a process of its own
    assert "state.add(amount=" in failure  # the shrunk steps, as hypothesis prints them
