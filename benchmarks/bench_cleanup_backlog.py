"""A cleanup backlog deleted with flat memory (issue 35): peak resident memory against the
backlog's size.

    python benchmarks/bench_cleanup_backlog.py                    # 20,000 / 100,000 / 300,000
    python benchmarks/bench_cleanup_backlog.py --files 1000000
    python benchmarks/bench_cleanup_backlog.py --one 100000       # one size, this process

Each size runs in a fresh process with its own SQLite catalog and local root: one query of
200 stores, each with ``--per-store`` files that a writer recorded and never committed (an
attempt that lost: orphans, deletable once past the grace), empty files on disk, recorded
through the catalog's own ``record_files``; then copied (:func:`fleet.copy_root`, catalog rows
and hard links) to as many queries as the size needs. The pass measured is an executed
``cleanup_pass`` (every orphan past the grace), after the build, with the peak resident
memory reset (:func:`peak_memory.reset_peak`): its peak, wall time and files deleted per
second. One line per size, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet import copy_root
from peak_memory import peak_rss, reset_peak

from state_runtime.catalog import Catalog
from state_runtime.identity import FileKind, StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass
from state_runtime.storage import LocalStorage
from state_runtime.store.checkpoint_info import CheckpointInfo

PARTITIONS = 200
LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)


def _orphan(store: StoreId) -> CheckpointInfo:
    """A first delta a writer recorded and never committed (empty): an attempt that lost."""
    version = 1
    cid = uuid.uuid4().hex
    return CheckpointInfo(
        store=store,
        version=version,
        checkpoint_id=cid,
        base_checkpoint_id=None,
        lineage=(),
        kind=FileKind.DELTA,
        path=store.file_path(version, cid, FileKind.DELTA),
        rows=0,
        file_rows=0,
        bytes_written=0,
        checksum=hashlib.sha256(b"").hexdigest(),
        created_at=LONG_AGO,
    )


def _query(catalog: Catalog, root: Path, per_store: int) -> None:
    storage = LocalStorage(root)
    stores = [StoreId(0, p) for p in range(PARTITIONS)]
    catalog.register_stores(storage.uri, stores, "k bigint", "v bigint")
    for _ in range(per_store):
        infos = [_orphan(s) for s in stores]
        catalog.record_files(storage.uri, infos)
        for i in infos:
            (root / i.path).parent.mkdir(parents=True, exist_ok=True)
            (root / i.path).touch()


def one(files: int, per_store: int, workers: int | None) -> dict[str, float]:
    """Build a backlog of about ``files`` files and delete it; the figures."""
    with tempfile.TemporaryDirectory(prefix="backlog-") as folder:
        catalog = Catalog.open(f"sqlite:///{folder}/catalog.db", upgrade=True)
        queries = max(1, round(files / (PARTITIONS * per_store)))
        started = time.perf_counter()
        template = Path(folder) / "query-00000"
        _query(catalog, template, per_store)
        for query in range(1, queries):
            copy_root(catalog, template, Path(folder) / f"query-{query:05d}")
        built = time.perf_counter() - started
        base = reset_peak()
        load = os.getloadavg()[0]
        started, cpu = time.perf_counter(), time.process_time()
        report = cleanup_pass(
            Fleet(catalog, owner="bench"),
            MaintenancePolicy(workers=workers),
            dry_run=False,
            now=datetime.now(UTC) + timedelta(days=30),
        )
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        catalog.close()
    return {
        "files": report.deleted_files,
        "planned": report.planned_files,
        "failed": report.failed_files,
        "busy_stores": len(report.busy),
        "stores": queries * PARTITIONS,
        "build_s": round(built, 1),
        "cleanup_s": round(seconds, 1),
        "cpu_s": round(cpu, 1),
        "files_per_s": round(report.deleted_files / seconds),
        "files_per_cpu_s": round(report.deleted_files / cpu),
        "load": round(load, 1),
        "rss_before_mb": round(base / 2**20, 1),
        "peak_rss_mb": round(peak_rss() / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 100_000, 300_000])
    parser.add_argument("--per-store", type=int, default=50)
    parser.add_argument("--workers", type=int, help="cleanup's workers (default: the host's)")
    parser.add_argument("--one", type=int, help="run one size in this process")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.per_store, args.workers)))
        return
    found = []
    for files in args.files:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(files), "--per-store", str(args.per_store)]
            + ([] if args.workers is None else ["--workers", str(args.workers)]),
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        found.append(figures)
        print(
            f"{figures['files']:>9,} files in {figures['stores']:>6,} stores: cleanup "
            f"{figures['cleanup_s']:>6.1f} s, CPU {figures['cpu_s']:.1f} s "
            f"({figures['files_per_s']:,} files/s, {figures['files_per_cpu_s']:,} per CPU-s), "
            f"load {figures['load']}, peak RSS "
            f"{figures['peak_rss_mb']:.0f} MB (before {figures['rss_before_mb']:.0f} MB; "
            f"ratio to the first {figures['peak_rss_mb'] / found[0]['peak_rss_mb']:.2f})",
            flush=True,
        )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
