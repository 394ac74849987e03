"""Validation that follows what changed: full against incremental, on stores with real files.

    STATE_BENCH_STORES=2000 python benchmarks/bench_validation.py   # PostgreSQL at 127.0.0.1

Builds ``STATE_BENCH_STORES`` stores (default 2,000) on local disk, 12 committed versions each
through the runtime's path (bench_maintenance's fleet B: 1,000 keys, 100 updated a batch), in
a PostgreSQL catalog of its own (created, then dropped). Then times validations: the first
(every file new), a full one (``verify_sample_percent`` 100: every file read again), an
incremental one with nothing new (0 percent: nothing read, one listing per store), one at
5 percent, and one at 5 percent after a new batch. Prints each run's time, files read and
found present, bytes read, storage requests, the full/incremental ratio and the load average.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from bench_maintenance import SERVER, Counting, RealFleet, Row, timed  # this folder is on sys.path
from fresh_database import fresh_database
from rich.console import Console
from rich.table import Table

from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy, run_checks

DATABASE = "state_validation_bench"
STORES = int(os.environ.get("STATE_BENCH_STORES", "2000"))
VERSIONS = 12
FULL = MaintenancePolicy(snapshot_min_deltas=100, lag_warn_deltas=100, lag_error_deltas=100)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    rows: list[Row] = []
    figures: dict[str, tuple[int, int, int]] = {}
    try:
        with fresh_database(SERVER, DATABASE) as url:
            catalog = Catalog.open(url, upgrade=True)
            print(f"building {STORES:,} stores x {VERSIONS} versions ({load()})", flush=True)
            real = RealFleet(catalog, folder / "fleet", STORES)
            real.commit(VERSIONS)
            counting = Counting(lambda root: real.storage)
            fleet = Fleet(catalog, roots=[real.storage.uri], open_storage=counting, owner="bench")

            def validate(step: str, percent: int) -> None:
                def work() -> str:
                    policy = replace(FULL, verify_sample_percent=percent)
                    report = run_checks(fleet, policy)
                    counts = report.validation.counts()
                    figures[step] = (counts["files"], counts["files_present"], counts["bytes_read"])
                    return ("ok" if report.ok else "PROBLEMS") + f", {load()}"

                timed(rows, step, STORES, counting, work)

            validate("first validation (every file new)", 5)
            validate("full (--full, 100%)", 100)
            validate("incremental, nothing new (0%)", 0)
            validate("incremental, nothing new (5%)", 5)
            real.commit(1)
            validate("incremental after a batch (5%)", 5)
            catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    table = Table(title=f"Validation of {STORES:,} stores ({os.cpu_count()} cores, PostgreSQL)")
    for name in ("run", "time", "files read", "found present", "MB read", "requests", "result"):
        table.add_column(name, justify="left" if name in {"run", "requests", "result"} else "right")
    for row in rows:
        read, present, size = figures[row.step]
        requests = ", ".join(f"{k} {v:,}" for k, v in sorted(row.requests.items())) or "none"
        table.add_row(
            row.step,
            f"{row.seconds:.2f} s",
            f"{read:,}",
            f"{present:,}",
            f"{size / 1e6:.1f}",
            requests,
            row.result,
        )
    Console(width=200).print(table)
    full = next(r.seconds for r in rows if r.step.startswith("full"))
    for row in rows[2:]:
        print(f"full / {row.step}: {full / row.seconds:.1f}x")


if __name__ == "__main__":
    main()
