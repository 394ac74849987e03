"""A running aggregation's first batch (every key once, as ``bench_e2e.py`` writes it) applied
to an empty store under a small budget, in a fresh process, without Spark: the task's own
memory for a batch of ``--rows`` new keys.

Prints, as JSON: the rows, the budget, the peak resident memory growth over the process's
baseline (VmHWM, after the input is built: ``peak_memory.py``), the bytes of the update's
output (the updated keys' totals, which the task hands to Spark whole), the transient bytes
(growth less the output and the 8-byte sort order of the rows, which a batch holds whole),
and the seconds.

    python benchmarks/bench_first_batch.py [--rows 1250000] [--budget-mib 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss, reset_peak

from state_runtime.runtime import Agg, running_aggregation
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import set_budget
from state_runtime.store.provider import StateStoreProvider


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_250_000)
    parser.add_argument("--budget-mib", type=int, default=4)
    args = parser.parse_args()
    budget = args.budget_mib << 20
    set_budget(budget)
    op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], 1)
    keys = np.random.default_rng(1).permutation(args.rows).astype(np.int64)
    rows = pa.table({"k": pa.array(keys)})
    with tempfile.TemporaryDirectory() as root:
        provider = StateStoreProvider(
            LocalStorage(root),
            0,
            0,
            op.store_name,
            key_schema=op.schema.key,
            value_schema=op.schema.value,
            config=op.config,
        )
        baseline = reset_peak() or peak_rss()
        started = time.perf_counter()
        store = provider.get_store(0, None)
        with batch_scope(BatchContext("bench", 0, 0, 0, stores={op.store_name: store})):
            output = op.update(store, rows)
            store.commit()
        seconds = time.perf_counter() - started
        growth = peak_rss() - baseline
    output_bytes = 0 if output is None else output.nbytes
    figures = {
        "rows": args.rows,
        "budget_bytes": budget,
        "peak_rss_growth_bytes": growth,
        "output_bytes": output_bytes,
        "transient_bytes": growth - output_bytes - 8 * args.rows,
        "seconds": round(seconds, 3),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
