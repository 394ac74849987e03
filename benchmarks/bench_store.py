"""Store benchmark: put/get rates, batch apply, commit cost vs state size, load vs raw pyarrow.

Run with ``make bench-store``. Prints a table; figures are medians of several runs on this
machine, with ratios against baselines measured in the same run.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable

import pyarrow as pa

from state_runtime import StateStoreProvider, StoreConfig
from state_runtime.checkpoint_format import ENVELOPE_SIZE
from state_runtime.storage import LocalStorage

KEY, VALUE = "k bigint", "count bigint"


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median wall time in seconds over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def provider(root: str, partition: int = 0) -> StateStoreProvider:
    return StateStoreProvider(
        LocalStorage(root),
        0,
        partition,
        key_schema=KEY,
        value_schema=VALUE,
        config=StoreConfig(cached_versions=2, min_deltas_for_snapshot=100),
    )


def populated(root: str, partition: int, size: int) -> tuple[StateStoreProvider, int, str]:
    p = provider(root, partition)
    store = p.get_store(0)
    store.apply(((i,), (i,)) for i in range(size))
    info = store.commit()
    return p, info.version, info.checkpoint_id


def single_call_rates(root: str, n: int) -> tuple[float, float, float]:
    p = provider(root, 99)
    store = p.get_store(0)
    keys = [(i,) for i in range(n)]
    started = time.perf_counter()
    for k in keys:
        store.put(k, k)
    put_rate = n / (time.perf_counter() - started)
    started = time.perf_counter()
    for k in keys:
        store.get(k)
    get_rate = n / (time.perf_counter() - started)
    store.abort()
    store = p.get_store(0)
    started = time.perf_counter()
    store.apply(zip(keys, keys, strict=True))
    apply_rate = n / (time.perf_counter() - started)
    store.abort()
    return put_rate, get_rate, apply_rate


def commit_cost(root: str, sizes: list[int], changes: int) -> list[tuple[int, float, int]]:
    rows = []
    rng = random.Random(7)
    for partition, size in enumerate(sizes):
        p, version, cid = populated(root, partition, size)
        times, sizes_written = [], []
        for _ in range(7):
            store = p.get_store(version, cid)
            for k in rng.sample(range(size), changes):
                store.put((k,), (k + 1,))
            started = time.perf_counter()
            info = store.commit()
            times.append(time.perf_counter() - started)
            sizes_written.append(info.bytes_written)
            version, cid = info.version, info.checkpoint_id
        rows.append((size, statistics.median(times), int(statistics.median(sizes_written))))
    return rows


def load_cost(root: str, size: int, deltas: int, changes: int) -> tuple[float, float, float]:
    p, version, cid = populated(root, 50, size)
    p.snapshot(version, cid)
    rng = random.Random(3)
    for _ in range(deltas):
        store = p.get_store(version, cid)
        for k in rng.sample(range(size), changes):
            store.put((k,), (k * 2,))
        info = store.commit()
        version, cid = info.version, info.checkpoint_id
    storage = p.storage
    paths = [f.path for f in storage.list(p.store_id.directory)]

    def load() -> None:
        provider(root, 50).get_read_store(version, cid)

    def raw_arrow() -> None:  # the same files, decoded by pyarrow alone
        for path in paths:
            data = storage.read(path)
            pa.ipc.open_stream(pa.py_buffer(data[ENVELOPE_SIZE:])).read_all()

    def raw_arrow_to_python() -> None:  # plus turning the columns into Python lists
        for path in paths:
            data = storage.read(path)
            t = pa.ipc.open_stream(pa.py_buffer(data[ENVELOPE_SIZE:])).read_all()
            t.column("key").combine_chunks().field(0).to_pylist()
            t.column("value").combine_chunks().field(0).to_pylist()

    return timed(load, 3), timed(raw_arrow, 3), timed(raw_arrow_to_python, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    big = sizes[-1]
    with tempfile.TemporaryDirectory(prefix="bench-store-") as root:
        print(
            f"machine: {platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}, pyarrow {pa.__version__}"
        )
        put_rate, get_rate, apply_rate = single_call_rates(root, 200_000)
        print("\n| operation | rate |\n|---|---|")
        print(f"| put (single call) | {put_rate / 1e6:.2f} M/s |")
        print(f"| get (single call) | {get_rate / 1e6:.2f} M/s |")
        print(f"| apply (batch call) | {apply_rate / 1e6:.2f} M/s |")
        rows = commit_cost(root, sizes, 1_000)
        base_t, base_b = rows[0][1], rows[0][2]
        print("\n| state keys | commit of 1,000 changes | ratio to 10k | delta bytes | ratio |")
        print("|---|---|---|---|---|")
        for size, t, b in rows:
            print(
                f"| {size:,} | {t * 1000:.1f} ms | {t / base_t:.2f}x | {b:,} | {b / base_b:.2f}x |"
            )
        load, raw, raw_py = load_cost(root, big, 10, 10_000)
        print(f"\n| load {big:,} keys: snapshot + 10 deltas of 10k changes | time | ratio |")
        print("|---|---|---|")
        print(
            f"| state_runtime (verify, decode, build dict, apply) | {load:.3f} s | "
            f"{load / raw:.1f}x |"
        )
        print(f"| pyarrow alone: read + decode the same files | {raw:.3f} s | 1.0x |")
        print(f"| pyarrow: read + decode + to_pylist | {raw_py:.3f} s | {raw_py / raw:.1f}x |")


if __name__ == "__main__":
    main()
