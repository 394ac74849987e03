"""Validation that follows what changed: full against incremental, on stores with real files.

    STATE_BENCH_STORES=2000 python benchmarks/bench_validation.py   # PostgreSQL at 127.0.0.1

Builds ``STATE_BENCH_STORES`` stores (default 2,000) on local disk, 12 committed versions each
through the runtime's path (bench_maintenance's fleet B: 1,000 keys, 100 updated a batch), in
a PostgreSQL catalog of its own (created, then dropped). Then times whole ``validate`` runs
(health and checks included, one worker, so that the figures are per store): the first
(every file new), a full one (``--full``: every file read again), an incremental one with
nothing new at 0 percent (nothing read, one listing per store: what is left is the catalog's
work), one at the default rate, and one at the default rate after a new batch. Prints each
run's time and time per store, the catalog statements it ran (per store), files read and
found present, bytes read, storage requests, the full/incremental ratios and the load.
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
from sqlalchemy import event

from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy, run_checks

DATABASE = "state_validation_bench"
STORES = int(os.environ.get("STATE_BENCH_STORES", "2000"))
VERSIONS = 12
POLICY = MaintenancePolicy(
    snapshot_min_deltas=100, lag_warn_deltas=100, lag_error_deltas=100, workers=1
)
DEFAULT = POLICY.verify_sample_percent


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    rows: list[Row] = []
    figures: dict[str, tuple[int, int, int]] = {}
    statements: dict[str, int] = {}
    try:
        with fresh_database(SERVER, DATABASE) as url:
            catalog = Catalog.open(url, upgrade=True)
            print(f"building {STORES:,} stores x {VERSIONS} versions ({load()})", flush=True)
            real = RealFleet(catalog, folder / "fleet", STORES)
            real.commit(VERSIONS)
            counting = Counting(lambda root: real.storage)
            fleet = Fleet(catalog, roots=[real.storage.uri], open_storage=counting, owner="bench")
            executed = [0]

            def count(*_: object) -> None:
                executed[0] += 1

            event.listen(catalog.engine, "before_cursor_execute", count)

            def validate(step: str, percent: int) -> None:
                def work() -> str:
                    policy = replace(POLICY, verify_sample_percent=percent)
                    executed[0] = 0
                    report = run_checks(fleet, policy)
                    statements[step] = executed[0]
                    counts = report.validation.counts()
                    figures[step] = (counts["files"], counts["files_present"], counts["bytes_read"])
                    return ("ok" if report.ok else "PROBLEMS") + f", {load()}"

                timed(rows, step, STORES, counting, work)

            validate("first validation (every file new)", DEFAULT)
            validate("full (--full, 100%)", 100)
            validate("incremental, nothing new (0%)", 0)
            validate(f"incremental, nothing new (default, {DEFAULT}%)", DEFAULT)
            real.commit(1)
            validate(f"incremental after a batch (default, {DEFAULT}%)", DEFAULT)
            catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    table = Table(title=f"Validation of {STORES:,} stores ({os.cpu_count()} cores, PostgreSQL)")
    columns = ("run", "time", "ms/store", "SQL/store", "files read", "found present", "MB read")
    for name in (*columns, "requests", "result"):
        table.add_column(name, justify="left" if name in {"run", "requests", "result"} else "right")
    for row in rows:
        read, present, size = figures[row.step]
        requests = ", ".join(f"{k} {v:,}" for k, v in sorted(row.requests.items())) or "none"
        table.add_row(
            row.step,
            f"{row.seconds:.2f} s",
            f"{row.seconds / STORES * 1000:.1f}",
            f"{statements[row.step] / STORES:.2f}",
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
    print(load())


if __name__ == "__main__":
    main()
