"""State larger than memory (issue 37): a store of N integer keys built and updated under a
small budget, in a fresh process.

Prints, as JSON: the state's Arrow bytes, the budget, the peak resident memory growth of this
process over its own baseline after imports and a warm-up (VmHWM: ``peak_memory.py``), the
bytes written to local disk, the write amplification (bytes written locally during the update
batches / the bytes of their changes as a run holds them: Arrow plus the 8-byte index),
median batch times, and a checksum of the final state (equal in memory and on disk).

    python benchmarks/bench_disk.py [--keys 8000000] [--budget-mib 32] [--batches 10]
        [--updates 10000] [--memory]   # --memory: the same run with everything in memory

``--levels`` measures instead what a level of runs side by side costs against one run file
of the same rows (docs/state-on-disk.md, "Compaction"): ``--keys`` rows (1.25M: a
partition's first batch at 5M keys) on disk as one file, as a level of 10 parts and of 64,
read alternately in one process ``--rounds`` times each: batch lookups of 2,500 and 250,000
random keys (half of them absent), 100 range scans of 1/1000 of the keys each, and one
iteration of every block. Prints each shape's medians in ms and the median over the rounds of
its time against one file's in the same round.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss

from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import set_budget
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_levels import AnyRun, RunLevel
from state_runtime.store.run_writer import written
from state_runtime.store.sorted_runs import Run
from state_runtime.store.versions import lookup

KEY = pa.struct([("k", pa.int64())])
VALUE = pa.struct([("v", pa.int64())])


def _table(keys: np.ndarray, values: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "key": pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY)),
            "value": pa.StructArray.from_arrays([pa.array(values)], fields=list(VALUE)),
        }
    )


def _round_trip(provider: StateStoreProvider) -> None:
    """Commit, look up and iterate a small store."""
    keys = np.arange(50_000, dtype=np.int64)
    store = provider.get_store(0)
    store.apply_arrow(_table(keys, keys))
    info = store.commit()
    store = provider.get_store(info.version, info.checkpoint_id)
    store.lookup(_table(keys[::7], keys[::7]).column("key").combine_chunks())
    store.apply_arrow(_table(keys[::3], keys[::3]))
    store.commit()
    sum(len(block) for block in store._blocks())


def _shapes(keys: int) -> tuple[KeyIndexer, dict[str, AnyRun]]:
    """The same ``keys`` rows (value = key) on disk as one file and as levels of 10 and 64."""
    indexer = KeyIndexer(KEY)
    table = _table(np.arange(keys, dtype=np.int64), np.arange(keys, dtype=np.int64))
    run = Run.build(indexer, table.column("key").chunk(0), table.column("value").chunk(0))[0]

    def on_disk(part: Run) -> AnyRun:
        return written("bench", [part], KEY, VALUE, part.nbytes, compaction=False)

    shapes: dict[str, AnyRun] = {"one file": on_disk(run)}
    for count in (10, 64):
        cuts = np.linspace(0, keys, count + 1).astype(int)
        parts = [on_disk(run.slice(lo, hi)) for lo, hi in itertools.pairwise(cuts)]
        shapes[f"{count} parts"] = RunLevel(parts)  # type: ignore[arg-type]
    return indexer, shapes


def _levels(args: argparse.Namespace) -> None:
    """One file against levels of 10 and 64 parts (``--levels``: see the module)."""
    set_budget(args.budget_mib << 20)
    indexer, shapes = _shapes(args.keys)
    rng = np.random.default_rng(1)
    index = np.sort(
        indexer.index(_table(np.arange(args.keys), np.arange(args.keys))["key"].chunk(0))
    )
    width = max(1, args.keys // 1000)
    times: dict[tuple[str, str], list[float]] = {}
    names = list(shapes)
    for r in range(args.rounds):
        probes = {
            f"lookup {n:,}": pa.StructArray.from_arrays(
                [pa.array(rng.integers(0, 2 * args.keys, n))], fields=list(KEY)
            )
            for n in (2_500, 250_000)
        }
        starts = np.sort(rng.integers(0, args.keys - width, 100))
        for name in names[r % 3 :] + names[: r % 3]:  # alternated, each round in a new order
            run = shapes[name]
            for what, keys in probes.items():
                t0 = time.perf_counter()
                found = lookup(indexer, [run], keys, VALUE)
                times.setdefault((name, what), []).append(time.perf_counter() - t0)
                assert found.null_count >= len(keys) // 3
            t0 = time.perf_counter()
            scanned = sum(
                len(run.between(int(index[s]), int(index[s + width - 1]))) for s in starts
            )
            times.setdefault((name, "100 range scans"), []).append(time.perf_counter() - t0)
            assert scanned == 100 * width, scanned
            t0 = time.perf_counter()
            assert sum(len(block) for block in run.blocks()) == args.keys
            times.setdefault((name, "iteration"), []).append(time.perf_counter() - t0)
    for (name, what), seconds in times.items():
        one = times[("one file", what)]
        figures = {
            "shape": name,
            "what": what,
            "median_ms": round(statistics.median(seconds) * 1000, 2),
            # each round's time against one file's in the same round: load drifts between
            "ratio": round(statistics.median(t / o for t, o in zip(seconds, one, strict=True)), 2),
        }
        print(json.dumps(figures))
    print(json.dumps({"keys": args.keys, "rounds": args.rounds, "load": os.getloadavg()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=8_000_000)
    parser.add_argument("--budget-mib", type=int, default=32)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=250_000)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--levels", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.levels:
        return _levels(args)
    budget = args.budget_mib << 20
    set_budget(budget if not args.memory else 1 << 40)
    root = tempfile.mkdtemp(prefix="bench-disk-")
    try:
        warm_up = StateStoreProvider(
            LocalStorage(root), 0, 1, key_schema="k bigint", value_schema="v bigint"
        )
        _round_trip(warm_up)  # the first call of each code path loads what it needs, once
        baseline = peak_rss()
        provider = StateStoreProvider(
            LocalStorage(root), 0, 0, key_schema="k bigint", value_schema="v bigint"
        )
        info = None
        started = time.perf_counter()
        for start in range(0, args.keys, args.chunk):  # build: keys in chunks, value = key
            store = (
                provider.get_store(0)
                if info is None
                else provider.get_store(info.version, info.checkpoint_id)
            )
            keys = np.arange(start, min(args.keys, start + args.chunk), dtype=np.int64)
            store.apply_arrow(_table(keys, keys))
            info = store.commit()
        build_s = time.perf_counter() - started
        assert info is not None
        written_before = LOCAL_DISK.stats.bytes_written
        rng = np.random.default_rng(1)
        times = []
        change_bytes = 0
        for _ in range(args.batches):  # read-modify-write: v += 1 on random keys
            t0 = time.perf_counter()
            store = provider.get_store(info.version, info.checkpoint_id)
            keys = np.unique(rng.integers(0, args.keys, args.updates))
            key_array = pa.StructArray.from_arrays([pa.array(keys)], fields=list(KEY))
            old = store.lookup(key_array).field("v").to_numpy()
            table = _table(keys, old + 1)
            change_bytes += table.nbytes + 8 * len(keys)  # as a run holds them: with the index
            store.apply_arrow(table)
            info = store.commit()
            times.append(time.perf_counter() - t0)
        read = provider.get_read_store(info.version, info.checkpoint_id)
        probes = rng.integers(0, args.keys, 2000)
        t0 = time.perf_counter()
        for k in probes[:2000]:
            read.get(int(k))
        get_us = (time.perf_counter() - t0) / 2000 * 1e6
        total = 0
        rows = 0
        for block in read._blocks():
            total = (total + int(block.values.field("v").to_numpy().sum())) % (1 << 61)
            rows += len(block)
        print(
            json.dumps(
                {
                    "mode": "memory" if args.memory else "disk",
                    "keys": args.keys,
                    "state_bytes": args.keys * 16,
                    "budget_bytes": budget,
                    "peak_rss_growth_bytes": peak_rss() - baseline,
                    "local_disk_bytes_written": LOCAL_DISK.stats.bytes_written,
                    "compaction_bytes": LOCAL_DISK.stats.compaction_bytes,
                    "write_amplification": (LOCAL_DISK.stats.bytes_written - written_before)
                    / max(1, change_bytes),
                    "block_cache_hits": LOCAL_DISK.stats.block_cache_hits,
                    "block_cache_misses": LOCAL_DISK.stats.block_cache_misses,
                    "build_s": round(build_s, 2),
                    "median_batch_ms": round(statistics.median(times) * 1000, 1),
                    "get_us": round(get_us, 1),
                    "rows": rows,
                    "checksum": total,
                    "load": os.getloadavg()[0],
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the checkpoints written: hundreds of MB at 8M


if __name__ == "__main__":
    main()
