"""The platform simulation's cost at a fixed seed: CPU a step, and catalog transactions and
statements by catalog call (the counts of docs/simulation.md, i34runs).

Runs ``tests.simulation.machine.PlatformMachine`` (SQLite catalog) as ``make test`` does, but
at ``global_force_seed = 20261128``, 10 runs of up to 40 steps, so main and a branch run the
same steps; run it on each, alternately, and compare:

    PYTHONPATH=. python benchmarks/bench_simulation_counts.py            # CPU and steps
    PYTHONPATH=. python benchmarks/bench_simulation_counts.py --count    # and the counts
    PYTHONPATH=. python benchmarks/bench_simulation_counts.py --count --rules  # by rule

``--count`` wraps the catalog's transaction helper (``Catalog._run``'s ``run_transaction``:
one transaction a call, its retries included) and listens to SQLAlchemy's ``begin`` and
``before_cursor_execute`` events; the wrapping costs CPU, so time without it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import hypothesis.core
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from sqlalchemy.engine import Connection, Engine

import state_runtime.catalog.api.transactions as transactions
import tests.simulation.machine as machine
from state_runtime.catalog.connection.engine import run_transaction

SEED = 20261128
RUNS = settings(
    max_examples=10,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
OUTSIDE = "(outside a catalog call)"
T = TypeVar("T")


class Counts:
    """Transactions and statements by catalog call (its ``what``), and calls by rule."""

    def __init__(self) -> None:
        self.transactions: Counter[str] = Counter()
        self.statements: Counter[str] = Counter()
        self.by_rule: Counter[tuple[str, str]] = Counter()
        self.begins = 0
        self.current = OUTSIDE

    def install(self) -> None:
        """Wrap the transaction helper the catalog calls and listen to every engine."""

        def counted(engine: Engine, work: Callable[[Connection], T], **kwargs: Any) -> T:
            what: str = kwargs["what"]
            self.transactions[what] += 1
            self.by_rule[_rule(), what] += 1
            outer, self.current = self.current, what
            try:
                return run_transaction(engine, work, **kwargs)
            finally:
                self.current = outer

        vars(transactions)["run_transaction"] = counted  # the name Catalog._run calls
        sa.event.listen(Engine, "begin", self._begin)
        sa.event.listen(Engine, "before_cursor_execute", self._statement)

    def _begin(self, _connection: Connection) -> None:
        self.begins += 1

    def _statement(self, *_args: object) -> None:
        self.statements[self.current] += 1

    def report(self, rules: bool) -> None:
        total = sum(self.statements.values())
        print(
            f"catalog calls (transactions) {sum(self.transactions.values())}, "
            f"BEGINs {self.begins}, statements {total}"
        )
        for what, n in self.transactions.most_common():
            print(f"  {what:45s} transactions {n:6d} statements {self.statements[what]:6d}")
        print(f"  {OUTSIDE:45s} statements {self.statements[OUTSIDE]:6d}")
        if rules:
            per_rule: Counter[str] = Counter()
            for (rule, _what), n in self.by_rule.items():
                per_rule[rule] += n
            for rule, n in per_rule.most_common():
                calls = sorted(
                    ((k, what) for (r, what), k in self.by_rule.items() if r == rule),
                    reverse=True,
                )
                print(f"{rule:30s} {n:6d}  " + ", ".join(f"{w} {k}" for k, w in calls))


def _rule() -> str:
    """The simulation rule (a method of machine.py) whose step makes the catalog call."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("simulation/machine.py") and code.co_name not in (
            "_guarded",
            "_batch",
            "batch",
        ):
            return code.co_name
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", action="store_true", help="count transactions, statements")
    parser.add_argument("--rules", action="store_true", help="with --count: calls by rule")
    args = parser.parse_args()
    counts = Counts()
    if args.count:
        counts.install()
    hypothesis.core.global_force_seed = SEED  # type: ignore[assignment]
    cpu, wall = time.process_time(), time.monotonic()
    run_state_machine_as_test(machine.PlatformMachine, settings=RUNS)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[0]
    print(
        f"steps {machine.STEPS}, CPU {cpu:.2f} s, wall {wall:.1f} s, "
        f"{machine.STEPS / cpu:.1f} steps a CPU-second, 1-minute load {load}"
    )
    if args.count:
        counts.report(args.rules)


if __name__ == "__main__":
    main()
