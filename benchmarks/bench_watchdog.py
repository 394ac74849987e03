"""What bounded waits cost a catalog call: the attempt watchdog on and off, in the same run.

Every catalog call runs its attempt under a client-side deadline (a watchdog thread cuts the
connection of an attempt that outlives ``CatalogTimeouts.attempt``). This times small, typical
calls (a batch commit of 4 stores, a read of committed ids, a maintenance run started and
finished) on one engine with the watchdog on and off, call by call, on PostgreSQL and SQLite,
and prints the medians and their ratio.

    make bench-watchdog        # PostgreSQL at 127.0.0.1:5432 (STATE_BENCH_PG to change)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from fresh_database import fresh_database

from state_runtime.catalog import Catalog
from state_runtime.catalog.connection.engine import ATTEMPT_TIMEOUT_OPTION
from state_runtime.identity import CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.store.checkpoint_info import CheckpointInfo

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
ROUNDS = int(os.environ.get("STATE_BENCH_ROUNDS", "300"))
ROOT, QUERY = "/bench/root", "bench-query"
STORES = [StoreId(0, p) for p in range(4)]


class Batches:
    """Batch after batch of one delta per store, as the Spark driver commits them."""

    def __init__(self) -> None:
        self.batch = 0
        self.latest: dict[StoreId, CheckpointRef] = {}

    def commit(self, catalog: Catalog) -> None:
        infos = [self._delta(store) for store in STORES]
        catalog.commit_batch(ROOT, QUERY, self.batch, infos)
        self.latest.update({info.store: info.ref for info in infos})
        self.batch += 1

    def _delta(self, store: StoreId) -> CheckpointInfo:
        parent = self.latest.get(store)
        version = 1 if parent is None else parent.version + 1
        checkpoint = new_checkpoint_id()
        return CheckpointInfo(
            store=store,
            version=version,
            checkpoint_id=checkpoint,
            base_checkpoint_id=None if parent is None else parent.checkpoint_id,
            lineage=() if parent is None else (parent,),
            kind=FileKind.DELTA,
            path=store.file_path(version, checkpoint, FileKind.DELTA),
            rows=100,
            file_rows=10,
            bytes_written=1000,
            checksum="0" * 64,
            created_at=datetime.now(UTC),
        )


def measure(url: str) -> dict[str, tuple[float, float]]:
    """Median seconds per call with the watchdog on and off, alternating call by call."""
    guarded = Catalog.open(url, upgrade=True)
    bare = Catalog(
        guarded.engine.execution_options(**{ATTEMPT_TIMEOUT_OPTION: 0}), retry=guarded.retry
    )
    batches = Batches()
    batches.commit(guarded)

    def run(catalog: Catalog) -> None:
        catalog.finish_run(catalog.start_run("validate", "bench"), "succeeded")

    calls: dict[str, Callable[[Catalog], object]] = {
        "commit 4 stores": batches.commit,
        "read committed ids": lambda c: c.committed_ids(ROOT, QUERY, batches.batch - 1),
        "start + finish run": run,
    }
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in calls}
    for round_ in range(ROUNDS):
        for name, call in calls.items():
            order = [(guarded, samples[name][0]), (bare, samples[name][1])]
            for catalog, into in order if round_ % 2 else reversed(order):
                started = time.perf_counter()
                call(catalog)
                into.append(time.perf_counter() - started)
    guarded.close()
    return {
        name: (statistics.median(on), statistics.median(off)) for name, (on, off) in samples.items()
    }


def main() -> None:
    load = os.getloadavg()[0]
    with (
        fresh_database(SERVER, f"state_bench_calls_{uuid.uuid4().hex[:8]}") as url,
        tempfile.TemporaryDirectory() as folder,
    ):
        results = {
            "postgresql": measure(url),
            "sqlite": measure(f"sqlite:///{Path(folder) / 'catalog.db'}"),
        }
    print(f"catalog calls, {ROUNDS} rounds, load average {load:.2f} on {os.cpu_count()} cores")
    print(f"{'database':<11} {'call':<20} {'watchdog on':>12} {'off':>10} {'on/off':>7}")
    for dialect, figures in results.items():
        for name, (on, off) in figures.items():
            ratio = on / off
            print(f"{dialect:<11} {name:<20} {on * 1e3:>10.2f}ms {off * 1e3:>8.2f}ms {ratio:>7.2f}")


if __name__ == "__main__":
    main()
