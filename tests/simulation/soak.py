"""The simulation for hours (``make soak``): random runs of the state machine until time is up,
printing the steps run and each failure; every new kind of failure is shrunk and saved.

    python -m tests.simulation.soak --minutes 120 --out soak-counterexamples [--postgresql]
        [--processes N]

``--processes`` soaks run at once (default: one per CPU), each in a fresh interpreter with
its own random runs and its failures in ``--out``'s ``process-K`` folder. Each run is
``--examples`` examples of :class:`~tests.simulation.machine.PlatformMachine` (up to
``--steps`` steps) with a fresh random seed. A failure is classed by its message (numbers and
ids masked); the first of each class is replayed from hypothesis's example database and
shrunk, and its steps are written to the folder (turn each into a test in
tests/simulation/test_found.py). Exit status: 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from tests.simulation import machine
from tests.simulation.machine import PlatformMachine
from tests.simulation.postgres import PostgresCatalogs
from tests.simulation.shards import fresh_interpreters

_MASK = re.compile(r"[0-9a-f]{32}|/tmp/[^ ,)']+|\d+")


def kind_of(error: BaseException) -> str:
    """A failure's class: its type and first line, numbers, ids and paths masked."""
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {_MASK.sub('#', first)[:160]}"


def steps_of(error: BaseException) -> str:
    """The failing steps hypothesis attached to ``error``."""
    return "\n".join(getattr(error, "__notes__", [])) or repr(error)


def report_of(kind: str, error: BaseException) -> str:
    """What a saved failure holds: its class, the steps, and the whole traceback, with every
    sub-exception of a group (a run hypothesis could not replay raises ``FlakyFailure``, whose
    only record of what failed is its sub-exceptions)."""
    trace = "".join(traceback.format_exception(error))
    return f"{kind}\n\n{steps_of(error)}\n\n{trace}\n"


def one_run(
    steps: int, examples: int, database: DirectoryBasedExampleDatabase, shrink: bool
) -> None:
    phases = [Phase.reuse, Phase.shrink] if shrink else [Phase.generate]
    run_state_machine_as_test(
        PlatformMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=database,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        ),
    )


@dataclass
class Soaked:
    """What a soak did: its runs, steps and failed runs, and the failures by kind."""

    runs: int = 0
    steps: int = 0
    failed: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    def add(self, other: Soaked) -> None:
        self.runs += other.runs
        self.steps += other.steps
        self.failed += other.failed
        self.kinds.update(other.kinds)


def soak(args: argparse.Namespace, out: Path, label: str = "") -> Soaked:
    """Random runs until ``args.minutes`` are up, in this process; each new kind of failure
    shrunk and saved in ``out``; a progress line (prefixed with ``label``) every
    ``args.report_every`` seconds."""
    if args.postgresql:
        PlatformMachine.catalogs = PostgresCatalogs()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.minutes * 60
    done, steps_before = Soaked(), machine.STEPS
    reported = started
    while time.monotonic() < deadline:
        examples = Path(tempfile.mkdtemp(prefix="soak-examples-"))
        database = DirectoryBasedExampleDatabase(str(examples))
        done.runs += 1
        try:
            one_run(args.steps, args.examples, database, shrink=False)
        except Exception as error:  # a failing run: class it, shrink the first of its kind
            done.failed += 1
            kind = kind_of(error)
            done.kinds[kind] += 1
            if done.kinds[kind] == 1:
                shrunk = _shrunk(args.steps, args.examples, database) or error
                saved = out / f"failure-{len(done.kinds)}.txt"
                saved.write_text(report_of(kind, shrunk))
                print(f"{label}new failure {len(done.kinds)}: {kind} ({saved})", flush=True)
        shutil.rmtree(examples, ignore_errors=True)
        done.steps = machine.STEPS - steps_before
        now = time.monotonic()
        if now - reported >= args.report_every or now >= deadline:
            reported = now
            print(
                f"{label}{(now - started) / 60:.1f} min: {done.runs} runs, {done.steps} steps, "
                f"{done.failed} failed runs in {len(done.kinds)} kinds",
                flush=True,
            )
    if isinstance(PlatformMachine.catalogs, PostgresCatalogs):
        PlatformMachine.catalogs.close()
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=60, help="steps per run (at most)")
    parser.add_argument("--examples", type=int, default=20, help="examples per run")
    parser.add_argument("--out", type=Path, default=Path("soak-counterexamples"))
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--postgresql", action="store_true", help="catalogs on PostgreSQL")
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="soaks at once (one a CPU)"
    )
    args = parser.parse_args(argv)
    if args.processes <= 1:
        done = soak(args, args.out)
    else:  # each in a fresh interpreter, its failures in a folder of its own
        done = Soaked()
        with fresh_interpreters(args.processes) as pool:
            futures = [
                pool.submit(soak, args, args.out / f"process-{k}", f"process {k}: ")
                for k in range(args.processes)
            ]
            for future in futures:
                done.add(future.result())
    print(f"done: {done.runs} runs, {done.steps} steps, {done.failed} failed runs")
    for kind, count in done.kinds.most_common():
        print(f"  {count:6d}  {kind}")
    return 1 if done.failed else 0


def _shrunk(
    steps: int, examples: int, database: DirectoryBasedExampleDatabase
) -> BaseException | None:
    """The failure just found, replayed from the example database and shrunk."""
    try:
        one_run(steps, examples, database, shrink=True)
    except unittest.SkipTest:  # nothing saved to replay: keep the failure as found
        return None
    except Exception as error:
        return error
    return None


if __name__ == "__main__":
    sys.exit(main())
