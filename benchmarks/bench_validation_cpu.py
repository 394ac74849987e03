"""Validation's and health's CPU per file at fleet size: one ``run_checks`` of the hour (issue 35).

    .venv/bin/python benchmarks/bench_validation_cpu.py [--stores 2000] [--runs 1] [--profile N]

On ``bench_snapshots.py``'s template fleet (PostgreSQL: ``stores / 200`` queries x 200
partitions, 12 versions of tiny deltas a store, every file verified, then 4 new batches: the
hour's new files), each run on a fresh copy of it, times one :func:`run_checks` at the default
policy (the hour's new files plus the 5% sample): validation's and health's wall and this
process's CPU (every thread), validation's CPU per file read, and the PostgreSQL backends'
CPU. ``--profile N``: a cProfile (CPU clock) of the run, its N costliest functions by tottime
and by cumulative time (the validation's chunks then run one after another on the calling thread:
cProfile sees one thread). The code measured is whatever ``state_runtime`` the interpreter
imports: run it with another checkout's ``PYTHONPATH`` for a before/after in one window.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from bench_snapshots import fresh, server_cpu, template  # this folder is on sys.path
from sqlalchemy.engine import make_url

from state_runtime.catalog import Catalog
from state_runtime.maintenance import (
    Fleet,
    HealthSpool,
    MaintenancePolicy,
    StoreReport,
    checks,
    run_checks,
    validation,
)

POLICY = MaintenancePolicy()


@contextmanager
def timed_stage(figures: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall and process CPU to ``figures[name + '_wall_s' / '_cpu_s']``."""
    started, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        figures[f"{name}_wall_s"] = figures.get(f"{name}_wall_s", 0.0) + (
            time.perf_counter() - started
        )
        figures[f"{name}_cpu_s"] = figures.get(f"{name}_cpu_s", 0.0) + (time.process_time() - cpu)


def measure(url: str, profile: int, workers: int | None) -> dict[str, float]:
    """One run_checks over the fleet: its figures (and a profile printed, given ``profile``)."""
    catalog = Catalog.open(url)
    database = make_url(url).database
    figures: dict[str, float] = {}
    validate, spool = checks.validate_stores, checks.HealthSpool

    def timed_validate(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        with timed_stage(figures, "validation"):
            return validate(*args, **kwargs)  # type: ignore[arg-type]

    class TimedSpool(spool):  # type: ignore[misc,valid-type]
        @classmethod
        def of(cls, pages: Iterable[list[StoreReport]]) -> HealthSpool:
            with timed_stage(figures, "health"):
                return spool.of(pages)

    checks.validate_stores, checks.HealthSpool = timed_validate, TimedSpool
    profiler = cProfile.Profile(time.process_time) if profile else None
    bounded = validation.map_bounded
    if profiler:  # on this thread, where the profiler sees them
        validation.map_bounded = lambda work, items, _workers, _name: map(work, items)
    try:
        fleet = Fleet(catalog, owner="bench-validation-cpu")
        before = server_cpu(database)
        started, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        report = run_checks(fleet, replace(POLICY, workers=workers))
        if profiler:
            profiler.disable()
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        after = server_cpu(database)
    finally:
        checks.validate_stores, checks.HealthSpool = validate, spool
        validation.map_bounded = bounded
        catalog.close()
    counts = report.validation.counts()
    assert report.validation.ok, report.summary()
    if profiler:
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler).sort_stats(order).print_stats(profile)
    files = counts["files"]
    return {
        "files_read": files,
        "files_present": counts["files_present"],
        "wall_s": wall,
        "cpu_s": used,
        **figures,
        "validation_cpu_ms_per_file": 1000 * figures["validation_cpu_s"] / files,
        "server_cpu_s": sum(s - before.get(pid, 0.0) for pid, s in after.items()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    folder = template("postgresql", args.stores)
    for _ in range(args.runs):
        url = fresh("postgresql", folder, args.stores)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        figures = measure(url, args.profile, args.workers)
        rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
        print(json.dumps({"stores": args.stores, "load": load, **rounded}), flush=True)


if __name__ == "__main__":
    main()
