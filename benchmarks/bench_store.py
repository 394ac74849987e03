"""Store benchmark: per-key rates, bulk apply vs a dict, commit cost vs state size, load vs a
raw pyarrow read, memory per key vs its Arrow size.

Run with ``make bench-store``. Prints tables; figures are medians of several runs on this
machine, with ratios against baselines measured in the same run: pyarrow reading the same
files, and a plain dict of key tuples to value tuples (how state was held before the columnar
representation; kept here, not in the library, as the baseline).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_runtime import CheckpointRef, StateStoreProvider, StoreConfig
from state_runtime.storage import LocalStorage
from state_runtime.store import compact_format
from state_runtime.store.checkpoint_format import ENVELOPE_SIZE
from state_runtime.store.column_encoding import ENCODINGS_KEY, decode_table
from state_runtime.store.sorted_runs import Run
from state_runtime.store.versions import row_change

KEY, VALUE = "k bigint", "count bigint"
SCHEMAS = {
    "k bigint -> count bigint": ("k bigint", "count bigint"),
    "user string -> count bigint, last string": ("user string", "count bigint, last string"),
}


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median wall time in seconds over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def provider(
    root: str, partition: int = 0, key: str = KEY, value: str = VALUE
) -> StateStoreProvider:
    return StateStoreProvider(
        LocalStorage(root),
        0,
        partition,
        key_schema=key,
        value_schema=value,
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
    info = store.commit()
    reader = p.get_read_store(info.version, info.checkpoint_id)
    started = time.perf_counter()
    for k in keys:
        reader.get(k)
    get_rate = n / (time.perf_counter() - started)
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

    key_type, value_type = p.schema.key_arrow, p.schema.value_arrow

    def raw_table(data: bytes) -> pa.Table:
        """A file's rows with pyarrow and numpy alone (no verification): a format 3 delta's
        bare buffers, or a format 2 snapshot's Arrow stream; then the narrow integer fields
        undone."""
        if data[8:10] == b"\x03\x00":
            parsed = compact_format.Parsed(data)
            stored = parsed.rows(key_type, value_type)
            return decode_table(stored, parsed.encodings, key_type, value_type)
        reader = pa.ipc.open_stream(pa.py_buffer(data[ENVELOPE_SIZE:]))
        raw = reader.schema.metadata.get(ENCODINGS_KEY)
        return decode_table(reader.read_all(), raw, key_type, value_type)

    def raw_arrow() -> None:  # the same files to their values with pyarrow and numpy alone
        for path in paths:
            raw_table(storage.read(path))

    def raw_arrow_to_python() -> None:  # plus turning the columns into Python lists
        for path in paths:
            t = raw_table(storage.read(path))
            t.column("key").combine_chunks().field(0).to_pylist()
            t.column("value").combine_chunks().field(0).to_pylist()

    return timed(load, 7), timed(raw_arrow, 7), timed(raw_arrow_to_python, 3)


def _rows(schema: str, keys: np.ndarray) -> pa.Table:
    """Rows of the benchmark's schemas in the checkpoint layout, for keys ``keys``."""
    if SCHEMAS[schema][0] == KEY:
        k = pa.StructArray.from_arrays([pa.array(keys)], names=["k"])
        v = pa.StructArray.from_arrays([pa.array(keys)], names=["count"])
    else:
        k = pa.StructArray.from_arrays([pa.array([f"user{x}" for x in keys])], names=["user"])
        v = pa.StructArray.from_arrays(
            [pa.array(keys), pa.array([f"/page/{x % 100}" for x in keys])],
            names=["count", "last"],
        )
    return pa.table({"key": k, "value": v})


def apply_vs_dict(root: str, size: int, updates: int) -> list[tuple[str, float, float]]:
    """10k updates arriving as Arrow, applied to ``size`` keys as a new version: the columnar
    bulk path vs the old dict representation (Arrow to Python tuples, dict updates, and the
    inverse diff kept so that the previous version stays readable)."""
    p = provider(root, 70)
    store = p.get_store(0)
    store.apply_arrow(_rows(next(iter(SCHEMAS)), np.arange(size)))
    info = store.commit()
    version = p.get_read_store(1, info.checkpoint_id)._version
    rng = np.random.default_rng(11)
    batch = _rows(next(iter(SCHEMAS)), rng.choice(size * 2, updates, replace=False))
    keys, values = batch.column("key").combine_chunks(), batch.column("value").combine_chunks()
    ref = CheckpointRef(2, "0" * 32)
    state = {(i,): (i,) for i in range(size)}  # the old representation

    def columnar(new_values: pa.StructArray) -> None:
        run, _ = Run.build(p.indexer, keys, new_values)
        version.derive(run, ref, (), version.rows + row_change(p.indexer, version.runs, run))

    def dict_apply(changes: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        inverse = {k: state.get(k) for k in changes}  # what the older version keeps
        state.update(changes)
        assert len(inverse) == len(changes)

    def python_rows() -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        return (
            [(k,) for k in keys.field(0).to_numpy().tolist()],
            [(v,) for v in values.field(0).to_numpy().tolist()],
        )

    def columnar_upsert() -> None:
        columnar(values)

    def dict_upsert() -> None:
        ks, vs = python_rows()
        dict_apply(dict(zip(ks, vs, strict=True)))

    def columnar_increment() -> None:  # what running_aggregation does per batch
        old = version.lookup(keys).field(0)
        total = pc.coalesce(pc.add(old, values.field(0)), values.field(0))
        columnar(pa.StructArray.from_arrays([total], names=["count"]))

    def dict_increment() -> None:  # what it did before, key by key
        ks, vs = python_rows()
        changes = {}
        for k, v in zip(ks, vs, strict=True):
            old = state.get(k)
            changes[k] = v if old is None else (old[0] + v[0],)
        dict_apply(changes)

    return [
        ("upsert", timed(columnar_upsert), timed(dict_upsert)),
        ("read-modify-write (count)", timed(columnar_increment), timed(dict_increment)),
    ]


def memory_per_key(root: str, size: int) -> list[tuple[str, float, float]]:
    """Bytes per key held by a loaded version vs the Arrow size of the same rows."""
    rows = []
    for n, (schema, (key, value)) in enumerate(SCHEMAS.items()):
        p = provider(root, 80 + n, key, value)
        table = _rows(schema, np.random.default_rng(n).permutation(size))
        store = p.get_store(0)
        store.apply_arrow(table)
        info = store.commit()
        for i in range(10):  # some layered changes too, as a live store has
            store = p.get_store(info.version, info.checkpoint_id)
            store.apply_arrow(_rows(schema, np.arange(i * 1000, i * 1000 + 1000)))
            info = store.commit()
        loaded = provider(root, 80 + n, key, value).get_read_store(info.version, info.checkpoint_id)
        version = loaded._version
        arrow = version.state()
        arrow_bytes = arrow.keys.nbytes + arrow.values.nbytes
        rows.append((schema, version.nbytes / version.rows, arrow_bytes / version.rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    big = sizes[-1]
    with tempfile.TemporaryDirectory(prefix="bench-store-") as root:
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} at start; {platform.python_implementation()} "
            f"{platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}"
        )
        put_rate, get_rate, apply_rate = single_call_rates(root, 200_000)
        print("\n| per-key API (200k keys) | rate |\n|---|---|")
        print(f"| put (single call) | {put_rate / 1e6:.2f} M/s |")
        print(f"| get (single call, after commit) | {get_rate / 1e6:.2f} M/s |")
        print(f"| apply (batch call of Python tuples) | {apply_rate / 1e6:.2f} M/s |")
        print(f"\n| 10k updates on {big:,} keys | columnar (bulk) | dict | dict / columnar |")
        print("|---|---|---|---|")
        for name, col, dic in apply_vs_dict(root, big, 10_000):
            print(f"| {name} | {col * 1000:.2f} ms | {dic * 1000:.2f} ms | {dic / col:.1f}x |")
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
            f"| state_runtime (verify, decode, index, apply) | {load:.3f} s | {load / raw:.1f}x |"
        )
        print(
            "| pyarrow alone: read + decode the same files (narrow fields undone) "
            f"| {raw:.3f} s | 1.0x |"
        )
        print(f"| pyarrow: read + decode + to_pylist | {raw_py:.3f} s | {raw_py / raw:.1f}x |")
        print(
            f"\n| memory, {big:,} keys + 10 commits of 1k | bytes/key held | Arrow bytes/key "
            "| ratio |"
        )
        print("|---|---|---|---|")
        for schema, held, arrow in memory_per_key(root, big):
            print(f"| {schema} | {held:.1f} | {arrow:.1f} | {held / arrow:.2f}x |")
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
