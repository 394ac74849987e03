"""The simulation split into seeded shards, run in processes of their own: ``make test``'s
runs use every CPU of the host, not one.

A shard is a fixed set of runs (hypothesis's examples from seed ``index``), so the runs are
the same on every host whatever its CPU count; only how many run at once depends on it. Each
shard runs in a fresh interpreter (``spawn``: nothing of the test process, its threads or its
Spark session, is copied) and reports its steps, its CPU time and, if a run failed, the
failure as hypothesis printed it (the shrunk steps are the exception's notes).

    python -m tests.simulation.shards [--shard N] [--processes P]

runs ``make test``'s shards (or shard N alone, to reproduce its failure) and prints what they
did; exit status 1 if a run failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from tests.simulation import machine
from tests.simulation.machine import PlatformMachine

SHARDS = 6
"""``make test``'s shards: three a process on a 2-CPU host."""
EXAMPLES = 14
"""Runs a shard (hypothesis's examples)."""
STEPS = 30
"""Steps a run, at most (hypothesis's ``stateful_step_count``): of the shapes tried (4 to 8
shards of 6 to 20 runs of 25 to 40 steps), 6 x 14 x 30 ran the most steps a CPU-second (68,
against 53 to 59: a longer run's steps load more retained versions, shorter runs pay more
for their set-up), 2,365 in all."""


@dataclass(frozen=True)
class ShardOutcome:
    """What one shard did: its steps, its process's CPU seconds, and its failure, if any."""

    index: int
    steps: int
    cpu: float
    failure: str | None


@dataclass(frozen=True)
class ShardsOutcome:
    """What the shards did together, and in how long."""

    shards: list[ShardOutcome]
    processes: int
    wall: float

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.shards)

    @property
    def cpu(self) -> float:
        return sum(s.cpu for s in self.shards)

    @property
    def failures(self) -> list[str]:
        return [
            f"shard {s.index} (again: python -m tests.simulation.shards --shard {s.index}):\n"
            + s.failure
            for s in self.shards
            if s.failure is not None
        ]

    def summary(self) -> str:
        return (
            f"{self.steps:,} checked steps in {len(self.shards)} shards: {self.wall:.1f} s wall "
            f"on {self.processes} processes, {self.cpu:.1f} s of CPU"
        )


def shard_settings(examples: int, steps: int) -> settings:
    """A shard's runs: ``examples`` runs of up to ``steps`` steps, from the shard's seed."""
    return settings(  # each field hypothesis's "ci" profile (loaded under CI) sets: runs alike
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,  # the seed decides the runs
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def run_shard(
    index: int,
    examples: int,
    steps: int,
    machine_type: type[RuleBasedStateMachine] = PlatformMachine,
) -> ShardOutcome:
    """Shard ``index``'s runs of ``machine_type``, in this process."""
    name = f"{machine_type.__name__}Shard{index}"
    seeded = seed(index)(type(name, (machine_type,), {}))
    before, started = machine.STEPS, time.process_time()
    failure = None
    try:
        run_state_machine_as_test(seeded, settings=shard_settings(examples, steps))
    except Exception as error:  # the traceback with hypothesis's notes (the steps)
        failure = "".join(traceback.format_exception(error))
    return ShardOutcome(index, machine.STEPS - before, time.process_time() - started, failure)


def fresh_interpreters(count: int) -> ProcessPoolExecutor:
    """``count`` worker processes, each a fresh interpreter (``spawn``): nothing of the
    caller's process (its threads, caches, Spark session) is copied into them."""
    return ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"))


def run_shards(
    shards: int,
    examples: int,
    steps: int,
    processes: int | None = None,
    machine_type: type[RuleBasedStateMachine] = PlatformMachine,
) -> ShardsOutcome:
    """``shards`` shards of ``examples`` runs each, on ``processes`` processes at once
    (default: one per CPU, at most one per shard)."""
    count = max(1, min(shards, processes or os.cpu_count() or 1))
    started = time.monotonic()
    with fresh_interpreters(count) as pool:
        futures = [pool.submit(run_shard, i, examples, steps, machine_type) for i in range(shards)]
        outcomes = [f.result() for f in futures]
    return ShardsOutcome(outcomes, count, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=int, help="run this shard alone, in this process")
    parser.add_argument("--processes", type=int, help="default: one per CPU")
    args = parser.parse_args(argv)
    if args.shard is not None:
        shard = run_shard(args.shard, EXAMPLES, STEPS)
        outcome = ShardsOutcome([shard], 1, shard.cpu)
    else:
        outcome = run_shards(SHARDS, EXAMPLES, STEPS, args.processes)
    print("\n\n".join(outcome.failures))
    print(outcome.summary())
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
