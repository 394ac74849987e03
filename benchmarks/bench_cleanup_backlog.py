"""A cleanup backlog deleted with flat memory (issue 35): peak resident memory against the
backlog's size.

    python benchmarks/bench_cleanup_backlog.py                    # 20,000 / 100,000 / 300,000
    python benchmarks/bench_cleanup_backlog.py --files 1000000
    python benchmarks/bench_cleanup_backlog.py --one 100000       # one size, this process
    python benchmarks/bench_cleanup_backlog.py --files 100000 --per-store 5 \
        --catalog postgresql --baseline /work/main                # this code against another

``--per-store 5`` is a fleet's shape (many stores, a few files each: the per-store catalog work
counts), 50 a backlog's. ``--catalog postgresql``: a fresh database on ``STATE_BENCH_PG``
(dropped at the end), whose backends' CPU time (``/proc``) is counted with the pass's.
``--baseline PATH``: each size also runs with the code at PATH (``PYTHONPATH``), right before
this code, on a backlog built the same way: the ratio of files per CPU-second is printed.

Each size runs in a fresh process with its own SQLite catalog and local root: one query of
200 stores, each with ``--per-store`` files that a writer recorded and never committed (an
attempt that lost: orphans, deletable once past the grace), empty files on disk, recorded
through the catalog's own ``record_files``; then copied (:func:`fleet.copy_roots`: each
query's catalog rows by ``INSERT ... SELECT``, its files hard-linked by ``cp -al`` alongside) to
as many queries as the size needs: every file is a real directory entry the pass unlinks, every
row one the pass claims and records (5,000,000 files built in 19.8 minutes under a load of
18 to 40: docs/maintenance.md, *Cleanup's row writes*). The pass measured is an executed
``cleanup_pass`` (every orphan past the grace), after the build, with the peak resident
memory reset (:func:`peak_memory.reset_peak`): its peak, wall time and files deleted per
second. One line per size, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet import copy_roots
from fresh_database import fresh_database
from peak_memory import peak_rss, reset_peak

from state_runtime.catalog import Catalog
from state_runtime.identity import FileKind, StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass
from state_runtime.storage import LocalStorage
from state_runtime.store.checkpoint_info import CheckpointInfo

PARTITIONS = 200
SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
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


def _backend_cpu(catalog: Catalog) -> dict[int, float]:
    """CPU seconds each PostgreSQL backend of the catalog's database has used (``/proc``: the
    server is on this host); empty for SQLite, whose work is this process's."""
    if catalog.engine.dialect.name != "postgresql":
        return {}
    with catalog.engine.connect() as connection:
        pids = connection.exec_driver_sql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).scalars()
        found = {}
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


@contextmanager
def _scratch() -> Iterator[str]:
    """A scratch folder, removed afterwards; a file left in it (a 100,000-file run once found
    the catalog's ``-wal`` and ``-shm`` made again while the folder was being removed) is named
    on stderr, not raised: the figures measured stand."""
    with tempfile.TemporaryDirectory(prefix="backlog-", ignore_cleanup_errors=True) as folder:
        yield folder
    if os.path.exists(folder):
        print(f"left in {folder}: {sorted(os.listdir(folder))}", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _catalog_url(kind: str, folder: str) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder}/catalog.db"
        return
    with fresh_database(SERVER, f"state_backlog_bench_{os.getpid()}") as url:
        yield url


def one(files: int, per_store: int, workers: int | None, kind: str) -> dict[str, float]:
    """Build a backlog of about ``files`` files and delete it; the figures."""
    with (
        _scratch() as folder,
        _catalog_url(kind, folder) as url,
    ):
        catalog = Catalog.open(url, upgrade=True)
        queries = max(1, round(files / (PARTITIONS * per_store)))
        started = time.perf_counter()
        template = Path(folder) / "query-00000"
        _query(catalog, template, per_store)
        copy_roots(catalog, template, [Path(folder) / f"query-{q:05d}" for q in range(1, queries)])
        built = time.perf_counter() - started
        if kind == "postgresql":
            with catalog.engine.connect() as connection:  # as autovacuum would have
                connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    "ANALYZE"
                )
        server = _backend_cpu(catalog)
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
        server_cpu = sum(t - server.get(pid, 0.0) for pid, t in _backend_cpu(catalog).items())
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
        "server_cpu_s": round(server_cpu, 1),
        "files_per_s": round(report.deleted_files / seconds),
        "files_per_cpu_s": round(report.deleted_files / (cpu + server_cpu)),
        "load": round(load, 1),
        "rss_before_mb": round(base / 2**20, 1),
        "peak_rss_mb": round(peak_rss() / 2**20, 1),
    }


def _run(files: int, args: argparse.Namespace, code: str | None) -> dict[str, float]:
    """One size in a fresh process, with the code at ``code`` (None: this code)."""
    env = dict(os.environ) | ({} if code is None else {"PYTHONPATH": code})
    done = subprocess.run(
        [sys.executable, __file__, "--one", str(files), "--per-store", str(args.per_store)]
        + ["--catalog", args.catalog]
        + ([] if args.workers is None else ["--workers", str(args.workers)]),
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:  # the child's error, not only its exit status
        raise SystemExit(
            f"{files:,} files with {code or 'this code'} failed:\n{done.stderr[-4000:]}"
        )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _line(label: str, figures: dict[str, float], first: dict[str, float]) -> str:
    return (
        f"{label}{figures['files']:>9,} files in {figures['stores']:>6,} stores: cleanup "
        f"{figures['cleanup_s']:>6.1f} s, CPU {figures['cpu_s']:.1f} s + catalog server "
        f"{figures['server_cpu_s']:.1f} s ({figures['files_per_s']:,} files/s, "
        f"{figures['files_per_cpu_s']:,} per CPU-s), load {figures['load']}, peak RSS "
        f"{figures['peak_rss_mb']:.0f} MB (before {figures['rss_before_mb']:.0f} MB; "
        f"ratio to the first {figures['peak_rss_mb'] / first['peak_rss_mb']:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 100_000, 300_000])
    parser.add_argument("--per-store", type=int, default=50)
    parser.add_argument("--workers", type=int, help="cleanup's workers (default: the host's)")
    parser.add_argument("--catalog", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--baseline", help="the code to compare with (a checkout's path)")
    parser.add_argument("--one", type=int, help="run one size in this process")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.per_store, args.workers, args.catalog)))
        return
    found = []
    for files in args.files:
        if args.baseline:
            before = _run(files, args, args.baseline)
            print(_line("baseline: ", before, before), flush=True)
        figures = _run(files, args, None)
        found.append(figures)
        print(_line("this code: " if args.baseline else "", figures, found[0]), flush=True)
        if args.baseline:
            ratio = figures["files_per_cpu_s"] / before["files_per_cpu_s"]
            print(f"  files per CPU-second, this code / baseline: {ratio:.2f}x", flush=True)
            figures["baseline"] = before  # type: ignore[assignment]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
