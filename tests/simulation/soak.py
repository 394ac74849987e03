"""The simulation for hours (``make soak``): random runs of the state machine until time is up,
printing the steps run and each failure; every new kind of failure is shrunk and saved.

    python -m tests.simulation.soak --minutes 120 --out soak-counterexamples [--postgresql]

Each run is ``--examples`` examples of :class:`~tests.simulation.machine.PlatformMachine` (up to
``--steps`` steps) with a fresh random seed. A failure is classed by its message (numbers and
ids masked); the first of each class is replayed from hypothesis's example database and
shrunk, and its steps are written to ``--out`` (turn each into a test in
tests/simulation/test_found.py). Exit status: 1 if any run failed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from tests.simulation import machine
from tests.simulation.machine import PlatformMachine
from tests.simulation.postgres import PostgresCatalogs

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=60, help="steps per run (at most)")
    parser.add_argument("--examples", type=int, default=20, help="examples per run")
    parser.add_argument("--out", type=Path, default=Path("soak-counterexamples"))
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--postgresql", action="store_true", help="catalogs on PostgreSQL")
    args = parser.parse_args(argv)
    if args.postgresql:
        PlatformMachine.catalogs = PostgresCatalogs()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.minutes * 60
    kinds: dict[str, int] = {}
    runs = failed = 0
    reported = started
    while time.monotonic() < deadline:
        examples = Path(tempfile.mkdtemp(prefix="soak-examples-"))
        database = DirectoryBasedExampleDatabase(str(examples))
        runs += 1
        try:
            one_run(args.steps, args.examples, database, shrink=False)
        except Exception as error:  # a failing run: class it, shrink the first of its kind
            failed += 1
            kind = kind_of(error)
            kinds[kind] = kinds.get(kind, 0) + 1
            if kinds[kind] == 1:
                shrunk = _shrunk(args.steps, args.examples, database) or error
                saved = args.out / f"failure-{len(kinds)}.txt"
                saved.write_text(report_of(kind, shrunk))
                print(f"new failure {len(kinds)}: {kind} (steps in {saved})", flush=True)
        shutil.rmtree(examples, ignore_errors=True)
        now = time.monotonic()
        if now - reported >= args.report_every or now >= deadline:
            reported = now
            print(
                f"{(now - started) / 60:.1f} min: {runs} runs, {machine.STEPS} steps, "
                f"{failed} failed runs in {len(kinds)} kinds",
                flush=True,
            )
    if isinstance(PlatformMachine.catalogs, PostgresCatalogs):
        PlatformMachine.catalogs.close()
    print(f"done: {runs} runs, {machine.STEPS} steps, {failed} failed runs")
    for kind, count in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {count:6d}  {kind}")
    return 1 if failed else 0


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
