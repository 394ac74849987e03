"""Cold start at scale (issue 37): a worker opens a store it never held, from a snapshot and
a delta, under a small budget (the snapshot streamed into a run on local disk) and with an
unbounded one (the snapshot read and decoded whole), each in a fresh process; then it writes
a snapshot of that version (from its runs on disk, block by block, or whole).

For each size it builds a store of N ``bigint -> bigint`` keys (value = key), snapshots it,
commits 10k updates on top, then measures in fresh processes: the time to open the latest
version, do 1,000 gets and scan every row, the time to write the snapshot, and the peak
resident memory growth over the process's own baseline after imports and a warm-up
(VmHWM), before and after the snapshot. Prints a table, one JSON line per run, and
the load average.

    python benchmarks/bench_cold_start.py [--keys 200000,2000000] [--budget-mib 4]
        [--updates 10000]   (the delta's size: as large as the state, it is streamed too)

``--s3`` keeps the store on S3 instead of a local folder: moto's server on loopback, in this
process, the children reaching it at ``BENCH_S3_URL`` (the cold open streams the snapshot's
GetObject body, or reads it whole).

``--prepare ROOT``, ``--load ROOT`` and ``--commit ROOT`` run one step each, as the tests do;
``--commit`` measures the peak of a commit of ``--updates`` changed rows on the head.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss, reset_peak

from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage, Storage
from state_runtime.storage.s3 import S3Storage
from state_runtime.store.cache import set_budget
from state_runtime.store.disk_runs import LOCAL_DISK

KEY = pa.struct([("k", pa.int64())])
VALUE = pa.struct([("v", pa.int64())])
ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "262144"}
"""The allocator settings docs/state-on-disk.md gives workers that hold state on disk."""


def _storage(root: str) -> Storage:
    """The folder ``root``; with ``BENCH_S3_URL`` set (``--s3``), the prefix named after it
    in moto's bucket."""
    url = os.environ.get("BENCH_S3_URL")
    if not url:
        return LocalStorage(root)
    return S3Storage("bench", Path(root).name, endpoint_url=url, **S3_CREDENTIALS)


S3_CREDENTIALS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "bench",
    "aws_secret_access_key": "bench",
}


def _provider(root: str, partition: int = 0) -> StateStoreProvider:
    return StateStoreProvider(
        _storage(root), 0, partition, key_schema="k bigint", value_schema="v bigint"
    )


def _moto() -> object:
    """moto's S3 server on loopback with the bucket ``bench``; its URL in ``BENCH_S3_URL``."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["BENCH_S3_URL"] = f"http://{host}:{port}"
    s3 = boto3.client("s3", endpoint_url=os.environ["BENCH_S3_URL"], **S3_CREDENTIALS)
    s3.create_bucket(Bucket="bench")
    return server


def _table(keys: np.ndarray, values: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY)),
            "value": pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE)),
        }
    )


def prepare(root: str, keys: int, updates: int = 10_000, *, snapshot: bool = True) -> None:
    """A snapshot of ``keys`` keys and a delta of ``updates`` random updates on top (fewer:
    repeats count once); the head in head.json. Without ``snapshot`` the first version stays
    a delta of value 1 a key, as a count's first batch leaves it (its consecutive keys and
    equal values compress to a few KB)."""
    provider = _provider(root)
    store = provider.get_store(0)
    for start in range(0, keys, 500_000):
        chunk = np.arange(start, min(keys, start + 500_000), dtype=np.int64)
        store.apply_arrow(_table(chunk, chunk if snapshot else np.ones_like(chunk)))
    info = store.commit()
    if snapshot:
        provider.snapshot(info.version, info.checkpoint_id)
    store = provider.get_store(info.version, info.checkpoint_id)
    updated = np.unique(np.random.default_rng(1).integers(0, keys, updates))
    store.apply_arrow(_table(updated, updated + 1))
    head = store.commit()
    Path(root, "head.json").write_text(json.dumps([head.version, head.checkpoint_id]))


def _warm_up(budget_mib: int, *, memory: bool) -> int:
    """Set the budget, commit, snapshot and reopen a small store (imports, first
    allocations); return the peak resident memory after it."""
    set_budget(1 << 40 if memory else budget_mib << 20)
    with tempfile.TemporaryDirectory(prefix="bench-cold-warm-") as warm:
        warm_up = _provider(warm, 1)
        small = np.arange(50_000, dtype=np.int64)
        store = warm_up.get_store(0)
        store.apply_arrow(_table(small, small))
        done = store.commit()
        warm_up.snapshot(done.version, done.checkpoint_id)
        _provider(warm, 1).get_read_store(done.version, done.checkpoint_id).get(7)
        return peak_rss()


def commit(
    root: str, budget_mib: int, updates: int, *, memory: bool, calls: int = 1
) -> dict[str, object]:
    """Open the head, put ``updates`` rows (keys 0 to updates - 1, value = key + 2) in
    ``calls`` ``apply_arrow`` calls of equal size, commit: the commit's peak resident memory
    growth over the resident memory just before it (its own, whatever the puts held), and
    the batch's (the calls and the commit) over the resident memory before the first call;
    the new head in head.json, for ``--load`` to read back."""
    _warm_up(budget_mib, memory=memory)
    version, checkpoint_id = json.loads(Path(root, "head.json").read_text())
    store = _provider(root).get_store(version, checkpoint_id)
    written_before = LOCAL_DISK.stats.bytes_written
    batch_before = reset_peak()
    started = time.perf_counter()
    bounds = np.linspace(0, updates, calls + 1).astype(np.int64)
    for start, stop in itertools.pairwise(bounds.tolist()):  # each call's keys made for it
        part = np.arange(start, stop, dtype=np.int64)
        store.apply_arrow(_table(part, part + 2))
    applied = time.perf_counter()
    calls_peak = peak_rss()
    before = reset_peak()  # the commit's own peak from here
    head = store.commit()
    elapsed = time.perf_counter() - applied
    commit_peak = peak_rss()
    Path(root, "head.json").write_text(json.dumps([head.version, head.checkpoint_id]))
    return {
        "mode": "memory" if memory else "streamed",
        "changed_rows": updates,
        "calls": calls,
        "budget_bytes": budget_mib << 20,
        "apply_s": round(applied - started, 3),
        "commit_s": round(elapsed, 3),
        "commit_peak_rss_growth_bytes": commit_peak - before,
        "batch_peak_rss_growth_bytes": max(calls_peak, commit_peak) - batch_before,
        "delta_bytes": head.bytes_written,
        "batch_local_disk_bytes_written": LOCAL_DISK.stats.bytes_written - written_before,
        "load": os.getloadavg()[0],
    }


def load(root: str, budget_mib: int, *, memory: bool) -> dict[str, object]:
    """Open the head cold, 1,000 gets and a full scan: time, memory and a checksum."""
    baseline = _warm_up(budget_mib, memory=memory)
    version, checkpoint_id = json.loads(Path(root, "head.json").read_text())
    started = time.perf_counter()
    provider = _provider(root)
    read = provider.get_read_store(version, checkpoint_id)
    opened = time.perf_counter() - started
    for k in np.random.default_rng(2).integers(0, read.metrics.rows, 1000):
        read.get(int(k))
    total = rows = 0
    for block in read._blocks():
        total = (total + int(block.values.field("v").to_numpy().sum())) % (1 << 61)
        rows += len(block)
    total_s = time.perf_counter() - started
    peak = peak_rss() - baseline
    started = time.perf_counter()
    provider.snapshot(version, checkpoint_id)  # from runs on disk when streamed
    return {
        "mode": "memory" if memory else "streamed",
        "rows": rows,
        "budget_bytes": budget_mib << 20,
        "open_s": round(opened, 3),
        "total_s": round(total_s, 3),
        "peak_rss_growth_bytes": peak,
        "snapshot_s": round(time.perf_counter() - started, 3),
        "peak_rss_growth_with_snapshot_bytes": peak_rss() - baseline,
        "local_disk_bytes_written": LOCAL_DISK.stats.bytes_written,
        "checksum": total,
        "load": os.getloadavg()[0],
    }


def _child(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env=os.environ | ENV,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="200000,2000000")
    parser.add_argument("--budget-mib", type=int, default=4)
    parser.add_argument("--updates", type=int, default=10_000, help="rows of the delta")
    parser.add_argument("--prepare", metavar="ROOT")
    parser.add_argument("--load", metavar="ROOT")
    parser.add_argument("--commit", metavar="ROOT", help="commit --updates rows on the head")
    parser.add_argument("--calls", type=int, default=1, help="apply_arrow calls of --commit")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--no-snapshot", action="store_true", help="--prepare: a first delta of 1s")
    parser.add_argument("--s3", action="store_true", help="the store on moto's S3 server")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, int(args.keys), args.updates, snapshot=not args.no_snapshot)
        return
    if args.commit:
        print(
            json.dumps(
                commit(
                    args.commit,
                    args.budget_mib,
                    args.updates,
                    memory=args.memory,
                    calls=args.calls,
                )
            )
        )
        return
    if args.load:
        print(json.dumps(load(args.load, args.budget_mib, memory=args.memory)))
        return
    if args.s3:
        _moto()
        print(f"storage: moto's S3 server at {os.environ['BENCH_S3_URL']}")
    print(f"load average before: {os.getloadavg()}")
    print(
        "keys       mode      open s  total s  peak RSS growth  local bytes written  "
        "snapshot s  peak RSS growth with the snapshot"
    )
    for keys in [int(k) for k in args.keys.split(",")]:
        root = tempfile.mkdtemp(prefix="bench-cold-")
        _child("--prepare", root, "--keys", str(keys), "--updates", str(args.updates))
        for mode in ("streamed", "memory"):
            extra = ["--memory"] if mode == "memory" else []
            line = _child("--load", root, "--budget-mib", str(args.budget_mib), *extra)
            r = json.loads(line)
            print(
                f"{keys:<10d} {mode:<9s} {r['open_s']:>6.2f}  {r['total_s']:>7.2f}  "
                f"{r['peak_rss_growth_bytes'] / 2**20:>12.1f} MiB  "
                f"{r['local_disk_bytes_written'] / 2**20:>12.1f} MiB  {r['snapshot_s']:>10.2f}  "
                f"{r['peak_rss_growth_with_snapshot_bytes'] / 2**20:>12.1f} MiB"
            )
            print(line)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
