"""Eviction benchmark: removing every window below a watermark bound from a windowed state.

Run with ``make bench-eviction``. A store keyed by (user string, window_start timestamp) holds
``--windows`` windows (users x windows per user) as a base run under a few change runs, as a
running query leaves it. Each figure removes the windows whose start is at or below a bound
from a fresh writable instance of that version (then aborts), median of several runs:

- ``remove_matching``: the runtime's path, one vectorised pass per sorted run and one bulk
  update (``StateStore.remove_matching``);
- baseline ``to_arrow + filter``: merge the runs into one table, filter, one bulk update;
- baseline ``remove_where``: the per-key Python predicate over every row.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bench_store import timed  # this folder is on sys.path when run as a script

from state_runtime import StateStoreProvider, StoreConfig
from state_runtime.storage import LocalStorage
from state_runtime.store.state_store import StateStore

KEY, VALUE = "user string, window_start timestamp", "n bigint, total bigint"
TS = pa.timestamp("us", tz="UTC")
WINDOW_US = 10_000_000


def _rows(users: np.ndarray, starts: np.ndarray, n: np.ndarray) -> pa.Table:
    keys = pa.StructArray.from_arrays(
        [pa.array([f"user{u}" for u in users]), pa.array(starts, type=TS)],
        names=["user", "window_start"],
    )
    values = pa.StructArray.from_arrays(
        [pa.array(n, type=pa.int64()), pa.array(n * 3, type=pa.int64())], names=["n", "total"]
    )
    return pa.table({"key": keys, "value": values})


def build(root: str, users: int, per_user: int, updates: int) -> tuple[StateStoreProvider, int]:
    provider = StateStoreProvider(
        LocalStorage(root), 0, 0, key_schema=KEY, value_schema=VALUE, config=StoreConfig()
    )
    u = np.repeat(np.arange(users), per_user)
    w = np.tile(np.arange(per_user), users) * WINDOW_US
    store = provider.get_store(0)
    store.apply_arrow(_rows(u, w, np.ones(len(u), dtype=np.int64)))
    info = store.commit()
    rng = np.random.default_rng(1)
    for _ in range(3):  # a few batches of updates on top: the version is layered
        pick = rng.integers(0, len(u), updates)
        store = provider.get_store(info.version, info.checkpoint_id)
        store.apply_arrow(_rows(u[pick], w[pick], np.full(updates, 2, dtype=np.int64)))
        info = store.commit()
    return provider, info.version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--per-user", type=int, default=100)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as root:
        provider, version = build(root, args.users, args.per_user, args.updates)
        windows = args.users * args.per_user
        print(f"{windows:,} windows ({args.users:,} users x {args.per_user}), version {version}")

        def fresh() -> StateStore:
            return provider.get_store(version)

        def by_runs(bound_us: int) -> Callable[[], object]:
            def run() -> object:
                store = fresh()
                removed = store.remove_matching(
                    lambda keys, _v: pc.less_equal(
                        pc.struct_field(keys, "window_start").cast(pa.int64()), bound_us
                    )
                )
                store.abort()
                return removed.num_rows

            return run

        def merged(bound_us: int) -> Callable[[], object]:
            def run() -> object:
                store = fresh()
                state = store.to_arrow()
                starts = pc.struct_field(state.column("key"), "window_start").cast(pa.int64())
                doomed = state.filter(pc.less_equal(starts, bound_us))
                keys = doomed.column("key").combine_chunks()
                store.apply_arrow(
                    pa.table({"key": keys, "value": pa.nulls(len(keys), store.schema.value_arrow)})
                )
                store.abort()
                return len(keys)

            return run

        def per_key(bound_us: int) -> Callable[[], object]:
            bound = datetime.fromtimestamp(bound_us / 1e6, tz=UTC)

            def run() -> object:
                store = fresh()
                n = store.remove_where(lambda k, _v: k[1] <= bound)
                store.abort()
                return n

            return run

        print()
        print(
            f"{'windows evicted':>18} | {'remove_matching':>15} | {'to_arrow+filter':>15} |"
            f" {'remove_where':>13} | ratio vs merge | ratio vs per-key"
        )
        for fraction in (0.0, 0.01, 0.1):
            bound_us = int(args.per_user * fraction) * WINDOW_US - 1
            evicted = by_runs(bound_us)()
            ours = timed(by_runs(bound_us), args.repeat)
            merge = timed(merged(bound_us), args.repeat)
            python = timed(per_key(bound_us), 1)
            print(
                f"{evicted:>18,} | {ours * 1000:>12.1f} ms | {merge * 1000:>12.1f} ms |"
                f" {python * 1000:>10.0f} ms | {merge / ours:>13.1f}x | {python / ours:>15.1f}x"
            )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
