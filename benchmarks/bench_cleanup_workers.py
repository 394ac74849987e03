"""Cleanup of a backlog with 1 worker and with the default count: local disk and S3 (moto).

    make bench-cleanup-workers              # PostgreSQL at 127.0.0.1:5432, user postgres
    STATE_BENCH_CLEANUP="200,106" ...        # stores, deletable files per store (about)

Each backlog is its own root in a PostgreSQL catalog: 200 stores, 12 versions committed
through ``commit_batch`` (the runtime's path), 8 losing attempts per store and version
(orphans, recorded as a task records its files), a verified snapshot at version 10: about
106 deletable files a store, 21,200 in all, each a small file in storage (local disk, or
moto's S3 server on loopback, seeded in its own process). Cleanup then deletes the backlog
(leases, claims, deletes, ledger) with 1 worker, and again on a twin backlog with the
default count (as many as the host and the catalog's pool allow). Printed: wall and CPU
seconds, files per second, the ratio, and the load average before each run (the machine
may be shared: ratios of runs in the same window are what to read).

The benchmark creates and finally drops its own database, ``state_cleanup_bench``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fresh_database import fresh_database
from rich.console import Console
from rich.table import Table

from state_runtime import CheckpointInfo
from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass
from state_runtime.maintenance.workers import worker_count
from state_runtime.storage import LocalStorage, Storage
from state_runtime.storage.s3 import S3Storage

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
DATABASE = "state_cleanup_bench"
STORES, PER_STORE = (int(x) for x in os.environ.get("STATE_BENCH_CLEANUP", "200,106").split(","))
VERSIONS, SNAPSHOT_AT = 12, 10
ATTEMPTS = max(1, (PER_STORE - SNAPSHOT_AT) // VERSIONS)
LATER = datetime.now(UTC) + timedelta(days=1)  # every file is past the window
POLICY = MaintenancePolicy(retention=RetentionPolicy(window=timedelta(hours=1)))
BODY = b"x" * 100


@dataclass
class Row:
    storage: str
    workers: int
    files: int
    wall: float
    cpu: float
    load: str


def info(store: StoreId, version: int, base: str | None, kind: FileKind) -> CheckpointInfo:
    cid = uuid.uuid4().hex
    return CheckpointInfo(
        store=store,
        version=version,
        checkpoint_id=cid,
        base_checkpoint_id=base,
        lineage=(CheckpointRef(version - 1, base),) if base else (),
        kind=kind,
        path=store.file_path(version, cid, kind),
        rows=10,
        file_rows=10,
        bytes_written=len(BODY),
        checksum=hashlib.sha256(BODY).hexdigest(),
        created_at=datetime.now(UTC),
    )


def build_backlog(catalog: Catalog, root: str, put: Callable[[list[str]], None]) -> int:
    """One root's backlog (see the module docstring); the files put in storage by ``put``;
    how many files were written."""
    stores = [StoreId(0, p) for p in range(STORES)]
    latest: dict[StoreId, CheckpointInfo] = {}
    written = 0
    for batch in range(VERSIONS):
        version = batch + 1
        losing = [
            info(s, version, latest[s].checkpoint_id if s in latest else None, FileKind.DELTA)
            for s in stores
            for _ in range(ATTEMPTS)
        ]
        catalog.record_files(root, losing)
        winning = [
            info(s, version, latest[s].checkpoint_id if s in latest else None, FileKind.DELTA)
            for s in stores
        ]
        catalog.commit_batch(root, "bench", batch, winning)
        latest = {i.store: i for i in winning}
        put([i.path for i in losing + winning])
        written += len(losing) + len(winning)
        if version == SNAPSHOT_AT:
            snapshots = [
                dataclasses.replace(
                    c,
                    kind=FileKind.SNAPSHOT,
                    path=c.store.file_path(c.version, c.checkpoint_id, FileKind.SNAPSHOT),
                )
                for c in latest.values()
            ]
            catalog.record_files(root, snapshots)
            catalog.record_verifications(root, {s.path: None for s in snapshots})
            put([s.path for s in snapshots])
            written += len(snapshots)
    return written


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def clean(catalog: Catalog, storage: Storage, workers: int | None) -> tuple[int, float, float]:
    fleet = Fleet(catalog, roots=[storage.uri], open_storage=lambda root: storage, owner="bench")
    wall, cpu = time.perf_counter(), time.process_time()
    report = cleanup_pass(fleet, POLICY, dry_run=False, now=LATER, workers=workers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if report.failed_files or report.busy:
        raise SystemExit(f"cleanup failed: {report.summary()}")
    return report.deleted_files, wall, cpu


@contextmanager
def moto_bucket() -> Iterator[tuple[Callable[[str], S3Storage], Callable[[str, list[str]], None]]]:
    """moto's S3 server on loopback (in this process): a storage per prefix, and a seeder
    that puts objects straight into moto's backend (set-up only: cleanup goes over HTTP)."""
    import boto3
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    keys = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", **keys).create_bucket(
        Bucket="bench"
    )
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def storage(prefix: str) -> S3Storage:
        return S3Storage("bench", prefix, endpoint_url=url, region_name="us-east-1", **keys)

    def seed(prefix: str, paths: list[str]) -> None:
        for path in paths:
            backend.put_object("bench", f"{prefix}/{path}", BODY)

    try:
        yield storage, seed
    finally:
        server.stop()


def run(url: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-cleanup-"))
    rows: list[Row] = []
    try:
        catalog = Catalog.open(url, upgrade=True)
        default = worker_count(catalog, POLICY)
        print(f"{STORES} stores, ~{PER_STORE} deletable files each; default workers: {default}")

        def local(name: str) -> tuple[Storage, Callable[[list[str]], None]]:
            storage = LocalStorage(folder / name)

            def put(paths: list[str]) -> None:
                for path in paths:
                    target = folder / name / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(BODY)

            return storage, put

        def measure(kind: str, make: Callable[[str], tuple[Storage, Callable]]) -> None:
            for workers in (1, None):
                storage, put = make(f"{kind.split()[0]}-{workers or 'default'}")
                started = time.perf_counter()
                files = build_backlog(catalog, storage.uri, put)
                with catalog.engine.connect() as connection:  # as autovacuum would have
                    connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                        "ANALYZE"
                    )
                print(f"  {kind}: built {files:,} files in {time.perf_counter() - started:.0f} s")
                before = load()
                deleted, wall, cpu = clean(catalog, storage, workers)
                rows.append(Row(kind, workers or default, deleted, wall, cpu, before))
                print(
                    f"  {kind}, {workers or default} worker(s): {deleted:,} deleted in {wall:.1f} s"
                )

        measure("local", local)
        with moto_bucket() as (s3, seed):

            def on_s3(name: str) -> tuple[Storage, Callable[[list[str]], None]]:
                return s3(name), lambda paths: seed(name, paths)

            measure("s3 (moto)", on_s3)
        catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(rows)


def main() -> None:
    with fresh_database(SERVER, DATABASE) as url:
        run(url)


def report(rows: list[Row]) -> None:
    table = Table(title=f"cleanup of a backlog, {os.cpu_count()} CPUs, PostgreSQL catalog")
    for name in ("storage", "workers", "files", "wall s", "CPU s", "files/s", "x 1 worker"):
        table.add_column(name, justify="left" if name == "storage" else "right")
    table.add_column("load 1/5/15 min before")
    base = {r.storage: r.wall for r in rows if r.workers == 1}
    for r in rows:
        table.add_row(
            r.storage,
            str(r.workers),
            f"{r.files:,}",
            f"{r.wall:.1f}",
            f"{r.cpu:.1f}",
            f"{r.files / r.wall:,.0f}",
            f"{base[r.storage] / r.wall:.2f}",
            r.load,
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
