"""Maintenance at scale: 10,000 stores in a PostgreSQL catalog, and 200 stores with real files.

    make bench-maintenance                  # PostgreSQL at 127.0.0.1:5432, user postgres
    STATE_BENCH_PG=postgresql+psycopg2://user@host:5432 python benchmarks/bench_maintenance.py

Fleet A (catalog only): 20 checkpoint roots x 500 stores, 12 committed versions each through
``commit_batch`` (the runtime's path), snapshots at version 10 (verified, as the snapshot pass
records them) for two stores in three, an abandoned attempt in one store in ten; every file is
two days old. Timed: the snapshot candidates, the cleanup plan, health of every store, and a
full cleanup (leases, claims, deletes against an empty local folder, ledger). Fleet B (real
files): 200 stores on local disk, 12 versions, then the snapshot pass, cleanup and validation.
Every step prints the storage requests it made: the normal path makes no LIST.

The benchmark creates and finally drops its own database, ``state_maintenance_bench``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fresh_database import fresh_database
from rich.console import Console
from rich.table import Table

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    cleanup_pass,
    due_for_snapshot,
    plan_cleanup,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime.storage import LocalStorage, Storage

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
DATABASE = "state_maintenance_bench"
ROOTS, STORES_PER_ROOT, VERSIONS = 20, 500, 12
REAL_STORES = 200
TWO_DAYS_AGO = datetime.now(UTC) - timedelta(days=2)
POLICY = MaintenancePolicy(
    snapshot_min_deltas=10, retention=RetentionPolicy(window=timedelta(hours=1))
)


@dataclass
class Row:
    step: str
    stores: int
    seconds: float
    result: str
    requests: dict[str, int]


class Counting:
    """One request counter over every storage the fleet opens."""

    def __init__(self, make: Callable[[str], Storage]) -> None:
        self.make = make
        self.opened: list[Storage] = []

    def __call__(self, root: str) -> Storage:
        storage = self.make(root)
        storage.requests.reset()  # count only what maintenance asks for
        self.opened.append(storage)
        return storage

    def reset(self) -> None:
        for storage in self.opened:
            storage.requests.reset()

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for storage in self.opened:
            for kind, n in storage.requests.counts.items():
                total[kind] = total.get(kind, 0) + n
        return total


def timed(
    rows: list[Row], step: str, stores: int, opener: Counting, work: Callable[[], str]
) -> None:
    opener.reset()
    started = time.perf_counter()
    result = work()
    rows.append(Row(step, stores, time.perf_counter() - started, result, opener.counts()))
    print(f"  {step}: {rows[-1].seconds:.2f} s ({result})", flush=True)


def fake_info(
    store: StoreId,
    version: int,
    base: str | None,
    lineage: tuple[CheckpointRef, ...],
    kind: FileKind = FileKind.DELTA,
    checkpoint_id: str | None = None,
) -> CheckpointInfo:
    cid = checkpoint_id or uuid.uuid4().hex
    return CheckpointInfo(
        store=store,
        version=version,
        checkpoint_id=cid,
        base_checkpoint_id=base,
        lineage=lineage,
        kind=kind,
        path=store.file_path(version, cid, kind),
        rows=1000,
        file_rows=100,
        bytes_written=2000 if kind is FileKind.DELTA else 20_000,
        checksum=hashlib.sha256(cid.encode()).hexdigest(),
        created_at=TWO_DAYS_AGO,
    )


def load_root(catalog: Catalog, r: int) -> None:
    """One root of fleet A: 500 stores, 12 batches, snapshots at 10, some abandoned attempts."""
    root = f"s3://bench/query-{r:02d}"
    stores = [StoreId(op, p) for op in range(2) for p in range(STORES_PER_ROOT // 2)]
    chains: dict[StoreId, list[CheckpointInfo]] = {s: [] for s in stores}
    for batch in range(VERSIONS):
        if batch == VERSIONS - 1:  # attempts that lose to the committed ones: orphans
            catalog.record_files(
                root,
                [
                    fake_info(s, batch + 1, chains[s][-1].checkpoint_id, (chains[s][-1].ref,))
                    for s in stores[::10]
                ],
            )
        infos = [
            fake_info(
                s,
                batch + 1,
                chains[s][-1].checkpoint_id if chains[s] else None,
                tuple(c.ref for c in reversed(chains[s][-10:])),
            )
            for s in stores
        ]
        catalog.commit_batch(root, "bench", batch, infos)
        for info in infos:
            chains[info.store].append(info)
        if batch + 1 == 10:
            last = {s: chains[s][-1] for i, s in enumerate(stores) if i % 3}
            snapshots = [
                fake_info(
                    s, 10, c.base_checkpoint_id, c.lineage, FileKind.SNAPSHOT, c.checkpoint_id
                )
                for s, c in last.items()
            ]
            catalog.record_files(root, snapshots)
            # verified after writing, as the snapshot pass does: only then do they count
            catalog.record_verifications(root, {info.path: None for info in snapshots})


def load_catalog_fleet(catalog: Catalog) -> None:
    """Fleet A: 10,000 stores committed batch by batch through the catalog's API (two roots
    at a time), then ANALYZE, as autovacuum would have done on a live database."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done, _ in enumerate(pool.map(lambda r: load_root(catalog, r), range(ROOTS)), 1):
            print(
                f"  loaded root {done}/{ROOTS} ({time.perf_counter() - started:.0f} s)", flush=True
            )
    with catalog.engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")


class RealFleet:
    """Fleet B: stores with real files, 1,000 keys each, 100 updated per batch."""

    def __init__(self, catalog: Catalog, folder: Path, stores: int = REAL_STORES) -> None:
        self.catalog = catalog
        self.storage = LocalStorage(folder)
        self.stores = [StoreId(0, p) for p in range(stores)]
        self.providers = {
            s: StateStoreProvider(
                self.storage,
                s.operator_id,
                s.partition_id,
                key_schema="k bigint",
                value_schema="v bigint",
            )
            for s in self.stores
        }
        for s in self.stores:
            catalog.register_store(self.storage.uri, s, "k bigint", "v bigint")
        self.latest: dict[StoreId, CheckpointInfo] = {}
        self.batch = 0

    def commit(self, batches: int) -> None:
        for _ in range(batches):
            infos = []
            for s in self.stores:
                base = self.latest.get(s)
                provider = self.providers[s]
                store = (
                    provider.get_store(base.version, base.checkpoint_id)
                    if base
                    else provider.get_store(0)
                )
                first = self.batch * 100 % 1000
                for k in range(1000) if base is None else range(first, first + 100):
                    store.put((k,), (self.batch,))
                infos.append(store.commit())
            self.catalog.commit_batch(self.storage.uri, "bench-real", self.batch, infos)
            self.latest = {i.store: i for i in infos}
            self.batch += 1


def run(url: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-maintenance-"))
    rows: list[Row] = []
    try:
        catalog = Catalog.open(url, upgrade=True)
        print(f"fleet A: {ROOTS * STORES_PER_ROOT:,} stores x {VERSIONS} versions (catalog only)")
        load_catalog_fleet(catalog)
        empty = Counting(
            lambda root: LocalStorage(folder / "fleet-a" / hashlib.md5(root.encode()).hexdigest())
        )
        fleet = Fleet(
            catalog,
            roots=[f"s3://bench/query-{r:02d}" for r in range(ROOTS)],
            open_storage=empty,
            owner="bench",
        )
        n = ROOTS * STORES_PER_ROOT
        timed(
            rows,
            "snapshot candidates",
            n,
            empty,
            lambda: f"{len(due_for_snapshot(fleet, POLICY))} due",
        )
        timed(
            rows,
            "cleanup plan (dry run)",
            n,
            empty,
            lambda: f"{sum(1 for _ in plan_cleanup(fleet, POLICY))} files deletable",
        )
        timed(
            rows,
            "health of every store",
            n,
            empty,
            lambda: f"{len(store_reports(fleet, POLICY))} stores",
        )

        def clean() -> str:
            report = cleanup_pass(fleet, POLICY, dry_run=False)
            return f"{report.deleted_files} files deleted, {len(report.busy)} busy"

        timed(rows, "cleanup, executed", n, empty, clean)

        print(f"fleet B: {REAL_STORES} stores with real files x {VERSIONS} versions")
        real = RealFleet(catalog, folder / "fleet-b")
        real.commit(VERSIONS)
        counting = Counting(lambda root: real.storage)
        real_fleet = Fleet(catalog, roots=[real.storage.uri], open_storage=counting, owner="bench")

        def snapshots() -> str:
            return f"{snapshot_pass(real_fleet, POLICY).counts()['written']} written"

        timed(rows, "snapshot pass (real files)", REAL_STORES, counting, snapshots)
        real.commit(2)  # versions 14 and 13 load from the snapshots at 12: deltas 1..12 may go
        now = MaintenancePolicy(
            retention=RetentionPolicy(window=timedelta(0)), min_window=timedelta(0)
        )
        timed(
            rows,
            "cleanup, executed (real files)",
            REAL_STORES,
            counting,
            lambda: f"{cleanup_pass(real_fleet, now, dry_run=False).deleted_files} files deleted",
        )
        timed(
            rows,
            "validation (real files)",
            REAL_STORES,
            counting,
            lambda: "ok" if run_checks(real_fleet, POLICY).validation.ok else "PROBLEMS",
        )
        catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(rows)


def main() -> None:
    with fresh_database(SERVER, DATABASE) as url:
        run(url)


def report(rows: list[Row]) -> None:
    machine = f"{os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL"
    table = Table(title=f"Maintenance at scale ({machine})")
    for name in ("step", "stores", "time", "per store", "result", "storage requests", "LIST"):
        table.add_column(
            name, justify="left" if name in {"step", "result", "storage requests"} else "right"
        )
    for r in rows:
        requests = ", ".join(f"{k} {v:,}" for k, v in sorted(r.requests.items())) or "none"
        table.add_row(
            r.step,
            f"{r.stores:,}",
            f"{r.seconds:.2f} s",
            f"{r.seconds / r.stores * 1000:.2f} ms",
            r.result,
            requests,
            str(r.requests.get("list", 0)),
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
