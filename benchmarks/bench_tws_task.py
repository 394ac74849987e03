"""transformWithState without Spark: one state partition's batches of a workload of
``bench_e2e_tws.py`` (``--workload``, ``--form``), the task function driven directly on real
stores (local files), so the figures are the operator's own cost (no Spark job, no worker start).

A first batch with each of ``--keys`` keys once, then ``--batches`` batches of ``--updates``
random keys. Prints each batch's wall and CPU seconds (CPU: what the task costs whatever the
load); ``--profile [N]`` adds the top CPU costs of batch N (default: the last).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time

import pyarrow as pa
from bench_e2e_tws import OUTPUT, PROCESSORS

from state_runtime.runtime import transform_with_state
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.storage import open_storage
from state_runtime.store.config import StoreConfig
from state_runtime.store.provider import StateStoreProvider


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=25_000)
    parser.add_argument("--updates", type=int, default=2_500)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(PROCESSORS), default="value")
    parser.add_argument("--form", choices=("pandas", "row"), default="pandas")
    parser.add_argument("--profile", nargs="?", const=-1, type=int, help="a batch to profile")
    args = parser.parse_args()
    cls, time_mode = PROCESSORS[args.workload]
    pandas = args.form == "pandas"
    op = transform_with_state(
        0, ["k"], "k bigint", cls(pandas), OUTPUT, 1, time_mode=time_mode, pandas=pandas
    )
    rng = random.Random(42)
    inputs = [pa.table({"k": pa.array(range(args.keys), pa.int64())})] + [
        pa.table({"k": pa.array([rng.randrange(args.keys) for _ in range(args.updates)])})
        for _ in range(args.batches)
    ]
    profile = cProfile.Profile(time.process_time)
    with tempfile.TemporaryDirectory() as root:
        storage = open_storage(root)
        providers = {
            s.name: StateStoreProvider(
                storage,
                0,
                0,
                s.name,
                key_schema=s.schema.key,
                value_schema=s.schema.value,
                config=StoreConfig(),
            )
            for s in op.stores
        }
        ids: dict[str, str | None] = dict.fromkeys(providers)
        profiled = None if args.profile is None else range(len(inputs))[args.profile]
        for version, rows in enumerate(inputs):
            stores = {n: p.get_store(version, ids[n]) for n, p in providers.items()}
            batch = BatchContext("bench", version, 1000 * version, 0, stores=stores)
            started, cpu = time.perf_counter(), time.process_time()
            if version == profiled:
                profile.enable()
            try:
                with batch_scope(batch):
                    op.update(stores[op.store_name], rows)
                    ids.update((n, s.commit().checkpoint_id) for n, s in stores.items())
            finally:
                profile.disable()
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            print(f"batch {version}: {rows.num_rows} rows, {seconds:.3f} s, CPU {cpu:.3f} s")
    if profiled is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
