"""A running aggregation's first batch (every key once, as ``bench_e2e.py`` writes it) applied
to an empty store under a small budget, in a fresh process, without Spark: the task's own
memory for a batch of ``--rows`` new keys.

Prints, as JSON: the rows, the budget, the peak resident memory growth over the process's
baseline (VmHWM, after the input is built: ``peak_memory.py``), the bytes of the update's
output (the updated keys' totals, which the task hands to Spark whole), the transient bytes
(growth less the output and the 8-byte sort order of the rows, which a batch holds whole),
the seconds, and the local disk's figures: bytes written, of which compaction, the bytes of
the committed state's run files, the write amplification (written / state) and its bound for
the batch's chunks of whole keys in key order (docs/state-on-disk.md, "Write amplification").

    python benchmarks/bench_first_batch.py [--rows 1250000] [--budget-mib 4]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss, reset_peak

from state_runtime.runtime import Agg, aggregation, running_aggregation
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import set_budget
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.run_levels import held_bytes
from state_runtime.store.run_merges import MAX_PARTS


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
        before = LOCAL_DISK.snapshot()
        started = time.perf_counter()
        store = provider.get_store(0, None)
        with batch_scope(BatchContext("bench", 0, 0, 0, stores={op.store_name: store})):
            output = op.update(store, rows)
            info = store.commit()
        seconds = time.perf_counter() - started
        growth = peak_rss() - baseline
        after = LOCAL_DISK.snapshot()
        state = provider.get_read_store(info.version, info.checkpoint_id)
        state_bytes = sum(held_bytes(run) for run in state._runs())
    chunks = -(-args.rows // aggregation.CHUNK_ROWS)
    written = after.bytes_written - before.bytes_written
    output_bytes = 0 if output is None else output.nbytes
    figures = {
        "rows": args.rows,
        "budget_bytes": budget,
        "peak_rss_growth_bytes": growth,
        "output_bytes": output_bytes,
        "transient_bytes": growth - output_bytes - 8 * args.rows,
        "seconds": round(seconds, 3),
        "local_disk_bytes_written": written,
        "compaction_bytes": after.compaction_bytes - before.compaction_bytes,
        "state_file_bytes": state_bytes,
        "write_amplification": round(written / state_bytes, 2) if state_bytes else None,
        "write_amplification_bound": (
            1 if chunks <= MAX_PARTS else round(2 + math.log2(chunks / MAX_PARTS), 2)
        ),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
