"""A running aggregation's update batches as one Python worker of ``bench_e2e.py`` runs them,
without Spark: the task body (``tasks.run_partitions``) driven directly on real stores (local
files), in one process kept across batches as Spark keeps its Python workers.

The worker holds ``--partitions`` of ``bench_e2e``'s 4 state partitions (2: Spark's 4 shuffle
partitions run as 2 tasks on ``local[2]``): a first batch of every key of ``--keys`` whose
partition (``k % 4``) is the worker's, then ``--batches`` batches of ``--updates`` keys drawn
from all ``--keys`` (the worker's share of them), under ``STATE_CACHE_BYTES`` of
``--keys * 16 / --cache-fraction`` (bench_e2e's ``--cache-fraction``) and bench_e2e's allocator
settings for its workers (set them in the environment: ``ARROW_DEFAULT_MEMORY_POOL=system
MALLOC_MMAP_THRESHOLD_=262144``). It runs on whichever ``state_runtime`` is first on
``PYTHONPATH``, so two trees can be compared in alternated runs.

Prints one JSON line: the 1-minute load at the start and end, the first batch's seconds, each
update batch's wall and CPU seconds (CPU: the task's own cost whatever the load), the reports'
``load_ms`` and ``task_ms`` per partition, and the worker's peak resident memory.
``--profile`` adds the top CPU costs over the update batches (cProfile, CPU clock) on stderr.

    ARROW_DEFAULT_MEMORY_POOL=system MALLOC_MMAP_THRESHOLD_=262144 \\
        python benchmarks/bench_update_task.py [--keys 5000000] [--batches 12]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import multiprocessing
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss

from state_runtime.runtime import Agg, StatefulOperator, running_aggregation, worker
from state_runtime.runtime.tasks import (
    HEARTBEAT_COLUMN,
    PARTITION_COLUMN,
    REPORT_COLUMN,
    TaskReport,
    TaskSpec,
    run_partitions,
)
from state_runtime.settings import WorkerSettings
from state_runtime.storage import LocalStorage
from state_runtime.store.schema_history import SchemaHistory

SPARK_PARTITIONS = 4
"""bench_e2e's state partitions (``--partitions``)."""
SPARK_BATCH = 10_000
"""Rows in an Arrow batch Spark sends a Python worker (``maxRecordsPerBatch``)."""


def _spark_batches(keys: np.ndarray, mine: list[int]) -> Iterator[pa.RecordBatch]:
    """The rows as Spark sends them, then a heartbeat row for each of the worker's partitions."""
    for start in range(0, len(keys), SPARK_BATCH):
        k = keys[start : start + SPARK_BATCH]
        yield pa.record_batch(
            {
                "k": pa.array(k),
                PARTITION_COLUMN: pa.array((k % SPARK_PARTITIONS).astype(np.int32)),
                HEARTBEAT_COLUMN: pa.array(np.zeros(len(k), dtype=bool)),
            }
        )
    yield pa.record_batch(
        {
            "k": pa.nulls(len(mine), pa.int64()),
            PARTITION_COLUMN: pa.array(np.array(mine, dtype=np.int32)),
            HEARTBEAT_COLUMN: pa.array(np.ones(len(mine), dtype=bool)),
        }
    )


def _spec(op: StatefulOperator, root: str, batch_id: int, base: dict[int, Any], budget: int) -> Any:
    """The batch's task spec (``input_schema`` where the tree's spec still has it)."""
    extra: dict[str, Any] = {}
    if "input_schema" in {f.name for f in dataclasses.fields(TaskSpec)}:
        extra["input_schema"] = pa.schema(
            [("k", pa.int64()), (PARTITION_COLUMN, pa.int32()), (HEARTBEAT_COLUMN, pa.bool_())]
        )
    return TaskSpec(
        storage=LocalStorage(root),
        query_id="bench",
        batch_id=batch_id,
        run=f"bench-{batch_id}",
        operator=op,
        schema_histories={op.store_name: SchemaHistory.of(op.schema)},
        base={op.store_name: dict(base)},
        batch_time_ms=0,
        worker_settings=WorkerSettings(cache_bytes=budget),
        **extra,
    )


def _batch(
    op: StatefulOperator, root: str, batch_id: int, base: dict[int, Any], budget: int, keys: Any
) -> tuple[float, float, list[TaskReport]]:
    """One batch's task; its wall and CPU seconds and its reports (``base`` moved on)."""
    wall, cpu = time.perf_counter(), time.process_time()
    reports = []
    spec = _spec(op, root, batch_id, base, budget)
    for out in run_partitions(spec, _spark_batches(keys, sorted(base))):
        notes = out.column(REPORT_COLUMN)
        reports += [TaskReport.from_json(n) for n in notes.drop_null().to_pylist()]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for partition, report in zip(sorted(base), reports, strict=True):
        base[partition] = (report.info.version, report.info.checkpoint_id)
    return wall, cpu, reports


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _worker_process(conn: Connection, root: str, budget: int, profiled: bool) -> None:
    """A Python worker of its own: runs the tasks it is sent, one at a time, until ``None``;
    ``profiled``: the top CPU costs of the update batches after its first load from files
    (that batch included), on stderr at the end."""
    op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], SPARK_PARTITIONS)
    profile = cProfile.Profile(time.process_time)
    loaded = False
    while (task := conn.recv()) is not None:
        batch_id, base, keys = task
        if profiled and batch_id:
            profile.enable()
        wall, cpu, reports = _batch(op, root, batch_id, base, budget, keys)
        profile.disable()
        if not loaded and not any(r.load_source == "files" for r in reports):
            profile = cProfile.Profile(time.process_time)  # not yet: start again
        loaded = loaded or any(r.load_source == "files" for r in reports)
        conn.send((wall, cpu, [r.to_json() for r in reports], peak_rss()))
    if profiled and loaded:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def _two_workers(args: argparse.Namespace, every: np.ndarray, updates: list[np.ndarray]) -> None:
    """Every partition on two worker processes running at once, as ``local[2]``: two tasks
    of half the partitions each, given to the workers in a seeded random order each batch
    (Spark hands a task whichever Python worker is idle), so a partition's store is at times
    rolled forward or loaded from files by the worker that did not hold its last version."""
    budget = args.keys * 16 // args.cache_fraction
    tasks = [[0, 1], [2, 3]]
    rng = np.random.default_rng(7)
    spawn = multiprocessing.get_context("spawn")
    base: dict[int, Any] = {p: (0, None) for p in range(SPARK_PARTITIONS)}
    load_start = _load()
    with tempfile.TemporaryDirectory() as root:
        pipes = [spawn.Pipe() for _ in tasks]
        procs = [
            spawn.Process(target=_worker_process, args=(c, root, budget, args.profile))
            for _, c in pipes
        ]
        for p in procs:
            p.start()
        walls, cpus, sources, task_ms, commit_ms, peaks = [], [], [], [], [], [0, 0]
        for batch_id, keys in enumerate([every, *updates]):
            order = rng.permutation(len(tasks)) if batch_id else range(len(tasks))
            started = time.perf_counter()
            for (conn, _), task in zip(pipes, [tasks[i] for i in order], strict=True):
                part = {p: base[p] for p in task}
                conn.send((batch_id, part, keys[np.isin(keys % SPARK_PARTITIONS, task)]))
            cpu, batch_sources, batch_ms, batch_commit = 0.0, [], [], []
            for w, (conn, _) in enumerate(pipes):
                _, task_cpu, notes, peaks[w] = conn.recv()
                cpu += task_cpu
                for report in map(TaskReport.from_json, notes):
                    base[report.info.store.partition_id] = (
                        report.info.version,
                        report.info.checkpoint_id,
                    )
                    batch_sources.append(f"{report.load_source}:{round(report.load_ms)}")
                    batch_ms.append(round(report.task_ms))
                    batch_commit.append(round(report.info.timings_ms.get("commit", 0)))
            walls.append(round(time.perf_counter() - started, 3))
            cpus.append(round(cpu, 3))
            sources.append(batch_sources)
            task_ms.append(batch_ms)
            commit_ms.append(batch_commit)
        for conn, _ in pipes:
            conn.send(None)
        for p in procs:
            p.join()
    figures = {
        "label": args.label,
        "workers": 2,
        "load_start": load_start,
        "load_end": _load(),
        "first_s": walls[0],
        "median_wall_s": statistics.median(walls[1:]),
        "median_cpu_s": statistics.median(cpus[1:]),
        "wall_s": walls[1:],
        "cpu_s": cpus[1:],
        "load_source_ms": sources[1:],
        "task_ms": task_ms[1:],
        "commit_ms": commit_ms[1:],
        "peak_rss_mib": [round(p / 2**20, 1) for p in peaks],
        "budget_mib": round(budget / 2**20, 2),
    }
    print(json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--partitions", type=int, default=2, help="the worker's partitions")
    parser.add_argument("--cache-fraction", type=int, default=20)
    parser.add_argument("--label", default="")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--reloads", type=int, default=0, help="batches loading from files")
    parser.add_argument("--two-workers", action="store_true", help="all 4 partitions, 2 workers")
    args = parser.parse_args()
    budget = args.keys * 16 // args.cache_fraction
    op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], SPARK_PARTITIONS)
    rng = np.random.default_rng(42)
    every = rng.permutation(args.keys).astype(np.int64)
    mine = list(range(args.partitions))
    updates = [rng.integers(0, args.keys, args.updates) for _ in range(args.batches)]
    if args.two_workers:
        _two_workers(args, every, updates)
        return
    load_start = _load()
    base: dict[int, Any] = {p: (0, None) for p in mine}
    profile = cProfile.Profile(time.process_time)
    with tempfile.TemporaryDirectory() as root:
        first, _, _ = _batch(op, root, 0, base, budget, every[every % SPARK_PARTITIONS < len(mine)])
        walls, cpus, load_ms, task_ms, commit_ms = [], [], [], [], []
        for i, keys in enumerate(updates, start=1):
            if args.profile:
                profile.enable()
            wall, cpu, reports = _batch(
                op, root, i, base, budget, keys[keys % SPARK_PARTITIONS < len(mine)]
            )
            profile.disable()
            walls.append(round(wall, 3))
            cpus.append(round(cpu, 3))
            load_ms.append([round(r.load_ms) for r in reports])
            task_ms.append([round(r.task_ms) for r in reports])
            commit_ms.append([round(r.info.timings_ms.get("commit", 0)) for r in reports])
        reloads = []
        for i, keys in enumerate(updates[: args.reloads], start=len(updates) + 1):
            worker._providers.clear()  # a worker that never held the stores: loads from files
            times = os.times()
            wall, cpu, reports = _batch(
                op, root, i, base, budget, keys[keys % SPARK_PARTITIONS < len(mine)]
            )
            user, system = (b - a for a, b in zip(times[:2], os.times()[:2], strict=True))
            assert all(r.load_source == "files" for r in reports)
            reloads.append(
                {"wall": round(wall, 3), "user": round(user, 2), "sys": round(system, 2)}
            )
    figures = {
        "label": args.label,
        "reloads": reloads,
        "load_start": load_start,
        "load_end": _load(),
        "first_s": round(first, 2),
        "median_wall_s": statistics.median(walls),
        "median_cpu_s": statistics.median(cpus),
        "wall_s": walls,
        "cpu_s": cpus,
        "load_ms": load_ms,
        "task_ms": task_ms,
        "commit_ms": commit_ms,
        "peak_rss_mib": round(peak_rss() / 2**20, 1),
        "budget_mib": round(budget / 2**20, 2),
    }
    print(json.dumps(figures), flush=True)
    if args.profile:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
