"""The snapshot pass at fleet size: CPU per snapshot and the pass's wall time (issue 35).

    .venv/bin/python benchmarks/bench_snapshots.py [--stores 2000] [--backend sqlite,postgresql]
        [--runs 1] [--workers N]

A fleet of ``stores / 200`` queries x 200 partitions (``fleet.py``: 12 versions of tiny deltas
per store, snapshots staggered by partition, every file verified, then 4 new batches: 40% of
the stores are due at ``snapshot_min_deltas`` 10) is built once per backend as a template (one
query through the store and ``commit_batch``, the others copied by ``copy_root``), kept under
``$STATE_BENCH_SNAP_DIR`` (default ``/tmp/bench-snapshots``; PostgreSQL's databases are named
after ``$STATE_BENCH_SNAP_DB``, default ``bench_snap``, so that two benches can run at once).
Each run starts from a fresh copy of it (the catalog copied, SQLite's file or PostgreSQL's
``CREATE DATABASE ... TEMPLATE``; the files hard-linked: a snapshot is a new file) and times
one ``snapshot_pass`` with the default workers: its wall time and this process's CPU time
(every thread) per snapshot written; on PostgreSQL also the server's, the CPU time of the run
database's backends (those alive at the pass's end: the catalog's pool keeps its
connections), and the two together per snapshot. The code measured is whatever ``state_runtime`` the
interpreter imports: run it with another checkout's ``PYTHONPATH`` for a before/after in the
same window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas  # noqa: F401  pyarrow imports it on a first conversion: once a process, not timed
import psycopg2
from fleet import Shape, advance, build, copy_root, query_id
from sqlalchemy.engine import make_url

from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, MaintenancePolicy, SnapshotStatus, snapshot_pass

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
FOLDER = Path(os.environ.get("STATE_BENCH_SNAP_DIR", "/tmp/bench-snapshots"))
POLICY = MaintenancePolicy(snapshot_min_deltas=10)
HOUR = 4
DB = os.environ.get("STATE_BENCH_SNAP_DB", "bench_snap")


def _admin(sql: str) -> None:
    url = make_url(SERVER)
    connection = psycopg2.connect(
        host=url.host, port=url.port or 5432, user=url.username, dbname="postgres"
    )
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
    finally:
        connection.close()


def _url(backend: str, folder: Path, name: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{folder}/{name}.db"
    return make_url(SERVER).set(database=f"{DB}_{name}").render_as_string(False)


def template(backend: str, stores: int) -> Path:
    """The backend's template fleet of ``stores`` stores (built if absent)."""
    folder = FOLDER / f"{backend}-{stores}"
    done = folder / "built"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    run = folder / "run"
    run.mkdir(parents=True)
    url = _url(backend, folder, "template")
    if backend == "postgresql":
        _admin(f'DROP DATABASE IF EXISTS "{DB}_template_{stores}" WITH (FORCE)')
        url = _url(backend, folder, f"template_{stores}")
        _admin(f'CREATE DATABASE "{DB}_template_{stores}"')
    Catalog.open(url, upgrade=True).close()
    one = Shape(queries=1)
    build(url, run, one)
    advance(url, run, one, HOUR)
    catalog = Catalog.open(url)
    try:
        for q in range(1, stores // one.partitions):
            copy_root(catalog, run / query_id(0), run / query_id(q))
    finally:
        catalog.close()
    subprocess.run(["cp", "-al", str(run), str(folder / "files")], check=True)
    done.write_text(url)
    return folder


def fresh(backend: str, folder: Path, stores: int) -> str:
    """A fresh copy of the template's catalog and files; its catalog URL."""
    shutil.rmtree(folder / "run", ignore_errors=True)
    subprocess.run(["cp", "-al", str(folder / "files"), str(folder / "run")], check=True)
    if backend == "sqlite":
        shutil.copyfile(folder / "template.db", folder / "run.db")
        return _url(backend, folder, "run")
    _admin(f'DROP DATABASE IF EXISTS "{DB}_run" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{DB}_run" TEMPLATE "{DB}_template_{stores}"')
    return _url(backend, folder, "run")


def server_cpu(database: str) -> dict[int, float]:
    """CPU seconds (user and system) of each PostgreSQL backend of ``database`` on this host,
    by pid (a backend's process title names its database)."""
    found: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if title.startswith("postgres: ") and f" {database} " in title:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def measure(url: str, workers: int | None) -> dict[str, float]:
    catalog = Catalog.open(url)
    database = make_url(url).database if url.startswith("postgresql") else None
    try:
        fleet = Fleet(catalog, owner="bench-snapshots")
        before = server_cpu(database) if database else {}
        started, cpu = time.perf_counter(), time.process_time()
        report = snapshot_pass(fleet, POLICY, workers=workers)
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        after = server_cpu(database) if database else {}
    finally:
        catalog.close()
    written = report.count(SnapshotStatus.WRITTEN)
    assert written and not report.count(SnapshotStatus.FAILED), report.summary()
    figures = {
        "written": written,
        "wall_s": wall,
        "cpu_s": used,
        "cpu_ms_each": 1000 * used / written,
    }
    if database:
        server = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
        figures |= {
            "server_cpu_s": server,
            "server_ms_each": 1000 * server / written,
            "total_ms_each": 1000 * (used + server) / written,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=2000)
    parser.add_argument("--backend", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    for backend in args.backend.split(","):
        folder = template(backend, args.stores)
        for _ in range(args.runs):
            url = fresh(backend, folder, args.stores)
            load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
            figures = measure(url, args.workers)
            print(
                json.dumps({"backend": backend, "stores": args.stores, "load": load, **figures}),
                flush=True,
            )


if __name__ == "__main__":
    main()
