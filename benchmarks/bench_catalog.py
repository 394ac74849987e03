"""Catalog at scale: 10,000 stores and 1,000,000 checkpoint-file rows in PostgreSQL.

Loads a steady-state inventory with COPY, then times the maintenance questions through the
public API (and the bare SQL beside it) and shows with EXPLAIN that they run on indexes.

    make bench-catalog                      # PostgreSQL at 127.0.0.1:5432, user postgres
    STATE_BENCH_PG=postgresql+psycopg2://user@host:5432 python benchmarks/bench_catalog.py

The benchmark creates (and finally drops) its own database, ``state_catalog_bench``;
with ``STATE_BENCH_KEEP=1`` it keeps it and reuses it next time (to study query plans).

Data: 20 checkpoint roots (queries) x 500 stores. Each store has committed versions 1..90,
one delta each, snapshots every 10 versions up to its last snapshot L (80; 70 for every third
store), and orphan attempts. Cleanup last ran when L was new: files older than L - 5 are
'deleted' history, so each store has 8 deletable files now (6 superseded deltas, 2 orphans)
and 11 needed ones. Lineage JSON holds only the first ancestor (the queries walk base ids).
"""

from __future__ import annotations

import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.reading_views import READER_VIEWS
from state_runtime.catalog.schema.revision import upgrade
from state_runtime.catalog.sql.health import snapshot_candidates_query
from state_runtime.catalog.sql.retention import verdicts
from state_runtime.catalog.sql.scope import Scope
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo

SERVER = os.environ.get("STATE_BENCH_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
DATABASE = "state_catalog_bench"
ROOTS = int(os.environ.get("STATE_BENCH_ROOTS", "20"))  # 500 stores each
STORES_PER_ROOT, VERSIONS = 500, 90
PARTITIONS = 250  # stores per root = 2 operators x 250 partitions
FILES_PER_STORE = 100
NOW = datetime.now(UTC)
EPOCH = NOW - timedelta(days=10)
POLICY = RetentionPolicy(retain_versions=2, window=timedelta(hours=1))
REPEAT = 5
NULL = "\\N"  # COPY's NULL
ORPHAN_REASON = "another attempt at this version was committed"
# STATE_BENCH_KEEP=1 keeps the database afterwards and reuses it on the next run (no reload).
KEEP = os.environ.get("STATE_BENCH_KEEP") == "1"


def cid(store: int, version: int, attempt: int = 0) -> str:
    return f"{store:016x}{version:08x}{attempt:08x}"


def root_of(store: int) -> str:
    return f"s3://bench/query-{store // STORES_PER_ROOT:02d}"


def identity(store: int) -> tuple[int, int]:
    local = store % STORES_PER_ROOT
    return local // PARTITIONS, local % PARTITIONS


def last_snapshot(store: int) -> int:
    return 70 if store % 3 == 0 else 80


def ts(version: int) -> str:
    return (EPOCH + timedelta(minutes=version)).isoformat()


def files_of(store: int) -> Iterator[tuple[Any, ...]]:
    """(file_id, version, id, kind, base, state) for one store: 100 rows."""
    snap = last_snapshot(store)
    first = 1 + store * FILES_PER_STORE
    n = 0
    for version in range(1, VERSIONS + 1):
        state = "deleted" if version < snap - 5 else "committed"
        base = cid(store, version - 1) if version > 1 else None
        yield first + n, version, cid(store, version), "delta", base, state
        n += 1
        if version % 10 == 0 and version <= snap:
            state = "committed" if version == snap else "deleted"
            yield first + n, version, cid(store, version), "snapshot", base, state
            n += 1
    attempt = 1
    while n < FILES_PER_STORE:  # speculative duplicates and replaced attempts
        version = snap - 2 + attempt
        yield (
            first + n,
            version,
            cid(store, version, attempt),
            "delta",
            cid(store, version - 1),
            "orphan",
        )
        n += 1
        attempt += 1


def copy(cursor: Any, table: str, columns: str, rows: Iterator[str]) -> None:
    """COPY rows (tab-separated lines) into ``table`` in chunks."""
    buffer = io.StringIO()
    for count, line in enumerate(rows, 1):
        buffer.write(line)
        if count % 200_000 == 0:
            buffer.seek(0)
            cursor.copy_expert(f"COPY {table} ({columns}) FROM STDIN", buffer)
            buffer = io.StringIO()
    buffer.seek(0)
    cursor.copy_expert(f"COPY {table} ({columns}) FROM STDIN", buffer)


def load(url: str) -> dict[str, float]:
    """Create the schema and bulk-load the inventory; return load timings."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    engine = create_catalog_engine(url)
    upgrade(engine)
    engine.dispose()
    raw = engine.url.set(drivername="postgresql")
    connection = psycopg2.connect(
        host=raw.host, port=raw.port, user=raw.username, password=raw.password, dbname=raw.database
    )
    stores_total = ROOTS * STORES_PER_ROOT
    with connection, connection.cursor() as cursor:
        copy(
            cursor,
            "stores",
            "store_id, checkpoint_root, operator_id, partition_id, store_name, created_at,"
            " latest_version, latest_checkpoint_id, last_committed_at",
            (
                f"{s + 1}\t{root_of(s)}\t{identity(s)[0]}\t{identity(s)[1]}\tdefault\t{ts(0)}"
                f"\t{VERSIONS}\t{cid(s, VERSIONS)}\t{ts(VERSIONS)}\n"
                for s in range(stores_total)
            ),
        )
        checksum = "0" * 64
        t = time.perf_counter()
        copy(
            cursor,
            "checkpoint_files",
            "file_id, store_id, path, kind, version, checkpoint_id, base_checkpoint_id, lineage,"
            " size_bytes, rows, file_rows, checksum, created_at, recorded_at, state,"
            " state_changed_at, state_reason",
            (
                f"{fid}\t{s + 1}\tstate/{identity(s)[0]}/{identity(s)[1]}/default/"
                f"{v}_{i}.{kind}\t{kind}\t{v}\t{i}\t{base or NULL}\t"
                f"{json.dumps([[v - 1, base]]) if base else '[]'}\t"
                f"{400_000 if kind == 'snapshot' else 25_000}\t1000000\t"
                f"{1000000 if kind == 'snapshot' else 10000}\t{checksum}\t{ts(v)}\t{ts(v)}\t"
                f"{state}\t{ts(v)}\t{ORPHAN_REASON if state == 'orphan' else NULL}\n"
                for s in range(stores_total)
                for fid, v, i, kind, base, state in files_of(s)
            ),
        )
        timings[f"COPY {stores_total * FILES_PER_STORE:,} file rows"] = time.perf_counter() - t
        t = time.perf_counter()
        copy(
            cursor,
            "commit_log",
            "query_id, batch_id, store_id, version, checkpoint_id, file_id, committed_at",
            (
                f"query-{s // STORES_PER_ROOT:02d}\t{v - 1}\t{s + 1}\t{v}\t{i}\t{fid}\t{ts(v)}\n"
                for s in range(stores_total)
                for fid, v, i, kind, _, state in files_of(s)
                if kind == "delta" and state != "orphan"
            ),
        )
        timings[f"COPY {stores_total * VERSIONS:,} commit-log rows"] = time.perf_counter() - t
        for table, column in (("stores", "store_id"), ("checkpoint_files", "file_id")):
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s), (SELECT max("
                + column
                + ") FROM "
                + table
                + "))",
                (table, column),
            )
    connection.autocommit = True
    with connection.cursor() as cursor:
        t = time.perf_counter()
        cursor.execute("VACUUM ANALYZE")
        timings["VACUUM ANALYZE"] = time.perf_counter() - t
    connection.close()
    timings["load total"] = time.perf_counter() - started
    return timings


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Median wall time of REPEAT runs (after one warm-up), and the last result."""
    result = call()
    samples = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        result = call()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples), result


def next_delta(store: int) -> CheckpointInfo:
    """The delta of version VERSIONS + 1 for ``store``."""
    sid = StoreId(*identity(store))
    checkpoint = cid(store, VERSIONS + 1)
    return CheckpointInfo(
        store=sid,
        version=VERSIONS + 1,
        checkpoint_id=checkpoint,
        base_checkpoint_id=cid(store, VERSIONS),
        lineage=(CheckpointRef(VERSIONS, cid(store, VERSIONS)),),
        kind=FileKind.DELTA,
        path=sid.file_path(VERSIONS + 1, checkpoint, FileKind.DELTA),
        rows=1_000_000,
        file_rows=10_000,
        bytes_written=25_000,
        checksum="0" * 64,
        created_at=NOW,
    )


def by_root(claimed: list[Any]) -> dict[int, list[str]]:
    """Claimed files' paths grouped by root index."""
    grouped: dict[int, list[str]] = {}
    for verdict in claimed:
        grouped.setdefault(int(verdict.file.key.root.rsplit("-", 1)[1]), []).append(
            verdict.file.path
        )
    return grouped


def explain(engine: sa.Engine, statement: sa.Select[Any]) -> list[str]:
    compiled = statement.compile(
        dialect=postgresql.dialect(), compile_kwargs={"render_postcompile": True}
    )
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + str(compiled),
            compiled.params,
        ).scalars()
        return list(rows)


def plan_summary(lines: list[str]) -> str:
    scans = []
    for line in lines:
        text = line.strip().lstrip("-> ").strip()
        if "Scan" in text and " on " in text:
            scans.append(text.split("  ")[0])
    return "\n".join(f"      {s}" for s in dict.fromkeys(scans))


def main() -> None:
    admin = psycopg2.connect(
        sa.make_url(f"{SERVER}/postgres")
        .set(drivername="postgresql")
        .render_as_string(hide_password=False)
    )
    admin.autocommit = True
    url = f"{SERVER}/{DATABASE}"
    with admin.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        reuse = KEEP and cursor.fetchone() is not None
        if not reuse:
            cursor.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{DATABASE}"')
    try:
        run(url, load_data=not reuse)
    finally:
        if not KEEP:
            with admin.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        admin.close()


def run(url: str, *, load_data: bool) -> None:
    loading: dict[str, float] = {}
    if load_data:
        total = ROOTS * STORES_PER_ROOT
        print(f"loading {total:,} stores, {total * FILES_PER_STORE:,} file rows ...", flush=True)
        loading = load(url)
    catalog = Catalog.open(url)
    engine = catalog.engine
    with engine.connect() as connection:
        version = connection.exec_driver_sql("SHOW server_version").scalar()
        sizes = connection.exec_driver_sql(
            "SELECT pg_size_pretty(pg_total_relation_size('checkpoint_files')),"
            " pg_size_pretty(pg_database_size(current_database()))"
        ).one()
    one_root, one_store = root_of(1234), StoreId(*identity(1234))
    one_id = 1235
    where = f"state/{one_store.operator_id}/{one_store.partition_id}/default"
    path = f"{where}/78_{cid(1234, 78)}.delta"
    rows: list[tuple[str, float, str]] = []

    def measure(name: str, call: Callable[[], Any], describe: Callable[[Any], str]) -> Any:
        seconds, result = timed(call)
        rows.append((name, seconds, describe(result)))
        return result

    def once(name: str, call: Callable[[], Any], describe: Callable[[Any], str]) -> Any:
        t = time.perf_counter()
        result = call()
        rows.append((name + " (once)", time.perf_counter() - t, describe(result)))
        return result

    def files(r: list[Any]) -> str:
        return f"{len(r):,} files"

    # Read-only questions, median of REPEAT runs.
    measure("deletable files, all stores", lambda: catalog.deletable_files(POLICY, now=NOW), files)
    deletable_sql = sa.select(sa.func.count()).select_from(
        verdicts(READER_VIEWS, POLICY, Scope(), NOW, only_deletable=True).subquery()
    )
    with engine.connect() as connection:
        measure(
            "  the same, SQL only (count)",
            lambda: connection.execute(deletable_sql).scalar(),
            lambda r: f"{r:,} files",
        )
    measure(
        "deletable files, one root (500 stores)",
        lambda: catalog.deletable_files(POLICY, root=one_root, now=NOW),
        files,
    )
    measure(
        "deletable files, one store",
        lambda: catalog.deletable_files(POLICY, root=one_root, store=one_store, now=NOW),
        files,
    )
    measure(
        "snapshot candidates (>= 15 deltas)",
        lambda: catalog.snapshot_candidates(15),
        lambda r: f"{len(r):,} stores",
    )
    measure(
        "retained versions + their files, one store",
        lambda: catalog.retained_versions(one_root, one_store),
        lambda r: f"{sum(len(v.files) for v in r)} files",
    )
    measure(
        "explain(path)",
        lambda: catalog.explain(one_root, path, POLICY, now=NOW),
        lambda r: r.verdict.value,
    )
    measure(
        "store health, one root (500 stores)",
        lambda: catalog.store_health(POLICY, root=one_root, now=NOW),
        lambda r: f"{len(r)} stores",
    )
    measure(
        "store health, all stores",
        lambda: catalog.store_health(POLICY, now=NOW),
        lambda r: f"{len(r):,} stores",
    )
    measure(
        "committed ids of a batch (500 stores)",
        lambda: catalog.committed_ids(one_root, "query-02", 88),
        lambda r: f"{len(r)} stores",
    )
    plans = {
        "deletable files, one store": explain(
            engine,
            verdicts(READER_VIEWS, POLICY, Scope(store_ids=(one_id,)), NOW, only_deletable=True),
        ),
        "deletable files, all stores": explain(
            engine, verdicts(READER_VIEWS, POLICY, Scope(), NOW, only_deletable=True)
        ),
        "snapshot candidates": explain(engine, snapshot_candidates_query(READER_VIEWS, 15, None)),
    }

    # Writes, once each: a batch commit, then cleanup of one store and of everything.
    batch = [next_delta(s) for s in range(1000, 1000 + STORES_PER_ROOT)]
    once(
        "commit a batch of 500 stores",
        lambda: catalog.commit_batch(root_of(1000), "query-02", VERSIONS, batch),
        lambda r: f"{len(r.committed)} stores",
    )
    run_id = catalog.start_run("cleanup", "bench")
    claimed = once(
        "claim deletions, one store",
        lambda: catalog.claim_deletions(run_id, POLICY, one_root, [one_store], now=NOW),
        files,
    )
    once(
        "record deletions, one store",
        lambda: catalog.record_deletions(run_id, one_root, [v.file.path for v in claimed]),
        lambda r: f"{r} files",
    )
    everything: list[Any] = []
    once(
        f"claim deletions, all {ROOTS} roots",
        lambda: [
            everything.extend(
                catalog.claim_deletions(run_id, POLICY, root_of(r * STORES_PER_ROOT), now=NOW)
            )
            for r in range(ROOTS)
        ],
        lambda _: files(everything),
    )
    once(
        f"record deletions, all {ROOTS} roots",
        lambda: sum(
            catalog.record_deletions(run_id, root_of(r * STORES_PER_ROOT), paths)
            for r, paths in by_root(everything).items()
        ),
        lambda r: f"{r:,} files",
    )
    catalog.close()

    print()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"PostgreSQL {version}; checkpoint_files {sizes[0]} with indexes, database {sizes[1]}")
    print()
    for name, seconds in loading.items():
        print(f"  {name:<40} {seconds:8.1f} s")
    print()
    print(f"  {'question (median of 5)':<42} {'time':>10}   result")
    print(f"  {'-' * 42} {'-' * 10}   {'-' * 20}")
    for name, seconds, result in rows:
        shown = f"{seconds * 1000:8.1f} ms" if seconds < 10 else f"{seconds:8.2f} s "
        print(f"  {name:<42} {shown:>10}   {result}")
    print()
    for name, lines in plans.items():
        print(f"  EXPLAIN {name}: scans used")
        print(plan_summary(lines))
    print()
    print("  full plan, deletable files for one store:")
    print("\n".join(f"    {line}" for line in plans["deletable files, one store"]))


if __name__ == "__main__":
    main()
