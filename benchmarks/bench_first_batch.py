"""A running aggregation's first batch (every key once, as ``bench_e2e.py`` writes it) applied
to an empty store under a small budget, in a fresh process, without Spark: the task's own
memory for a batch of ``--rows`` new keys.

Prints, as JSON: the rows, the budget, the peak resident memory growth over the process's
baseline (VmHWM, after the input is built: ``peak_memory.py``), the bytes of the update's
largest output chunk (the output, the updated keys' totals, is yielded chunk by chunk and
dropped as it comes, as the task hands it to Spark), the transient bytes (growth less the
8-byte sort order of the rows, which a batch holds whole: the output's chunks are in it), the
Arrow memory pool's peak (``arrow_peak_bytes``: the update's transient Arrow buffers, which the
chunk size sets), the seconds, and the local disk's figures: bytes written, of which
compaction, and (without ``--task``) the bytes of the committed state's run files, the write
amplification (written / state) and its bound for the batch's chunks of whole keys in key order
(docs/state-on-disk.md, "Write amplification"). A task of 1,000 rows runs first, so that what
the libraries load on first use (pandas, which Arrow imports at its first array made from
Python objects) is in the baseline.

``--task N`` runs the whole task body instead (``tasks.run_partitions``, as a Spark worker
does): the rows arrive as Spark sends them, in batches of 10,000 with the routing and
heartbeat columns, spread over ``N`` state partitions, made one at a time as the task asks;
the output batches are dropped as Spark would send them on. The task then holds neither its
input nor its sort order whole: past ``partition_input.SPILL_ROWS`` rows a partition, both go
to sorted files on local disk (counted in the bytes written) and come back in pieces of whole
keys, so the transient is the whole growth.

    python benchmarks/bench_first_batch.py [--rows 1250000] [--budget-mib 4] [--task 2]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from peak_memory import peak_rss, reset_peak
from task_spec import first_batch_spec, first_batch_store

from state_runtime.runtime import Agg, StatefulOperator, aggregation, running_aggregation
from state_runtime.runtime.tasks import (
    HEARTBEAT_COLUMN,
    PARTITION_COLUMN,
    REPORT_COLUMN,
    run_partitions,
)
from state_runtime.settings import WorkerSettings
from state_runtime.storage import LocalStorage
from state_runtime.store.cache import set_budget
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.run_levels import held_bytes
from state_runtime.store.run_merges import MAX_PARTS

SPARK_BATCH = 10_000
"""Rows in an Arrow batch Spark sends a Python worker (``maxRecordsPerBatch``)."""


def _update(op: StatefulOperator, root: str, keys: np.ndarray) -> tuple[int, int, int]:
    """The update and commit alone, the output's chunks dropped as they come; the output's
    rows and its largest chunk's bytes, and the bytes of the committed state's runs."""
    with first_batch_store(op, LocalStorage(root)) as (provider, store):
        output = op.update(store, pa.table({"k": pa.array(keys)}))
        chunks = [output] if isinstance(output, pa.Table) else output or []
        rows, largest = 0, 0
        for chunk in chunks:
            assert isinstance(chunk, pa.Table)
            rows, largest = rows + chunk.num_rows, max(largest, chunk.nbytes)
        del chunks, output
        info = store.commit()
    state = provider.get_read_store(info.version, info.checkpoint_id)
    return rows, largest, sum(held_bytes(run) for run in state._runs())


def _spark_batches(keys: np.ndarray, partitions: int) -> Iterator[pa.RecordBatch]:
    """The rows as Spark sends them, made one batch at a time; then a heartbeat row for each
    state partition."""
    for start in range(0, len(keys), SPARK_BATCH):
        k = keys[start : start + SPARK_BATCH]
        yield pa.record_batch(
            {
                "k": pa.array(k.copy()),
                PARTITION_COLUMN: pa.array((k % partitions).astype(np.int32)),
                HEARTBEAT_COLUMN: pa.array(np.zeros(len(k), dtype=bool)),
            }
        )
    yield pa.record_batch(
        {
            "k": pa.nulls(partitions, pa.int64()),
            PARTITION_COLUMN: pa.array(np.arange(partitions, dtype=np.int32)),
            HEARTBEAT_COLUMN: pa.array(np.ones(partitions, dtype=bool)),
        }
    )


def _task(
    op: StatefulOperator, root: str, keys: np.ndarray, partitions: int, budget: int
) -> tuple[int, int]:
    """The whole task body; the output's rows and its largest batch's bytes (the output is
    dropped as sent)."""
    spec = first_batch_spec(op, LocalStorage(root), WorkerSettings(cache_bytes=budget))
    rows, largest, reports = 0, 0, 0
    for batch in run_partitions(spec, _spark_batches(keys, partitions)):
        largest = max(largest, batch.nbytes)
        notes = batch.num_rows - batch.column(REPORT_COLUMN).null_count
        rows, reports = rows + batch.num_rows - notes, reports + notes
    assert reports == partitions, reports
    return rows, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_250_000)
    parser.add_argument("--budget-mib", type=int, default=4)
    parser.add_argument("--task", type=int, default=0, metavar="PARTITIONS")
    args = parser.parse_args()
    budget = args.budget_mib << 20
    set_budget(budget)
    op = running_aggregation(0, ["k"], "k bigint", [Agg("count", "count")], max(1, args.task))
    keys = np.random.default_rng(1).permutation(args.rows).astype(np.int64)
    with tempfile.TemporaryDirectory() as warm:  # libraries loaded, pandas by Arrow's shim
        _task(op, warm, keys[:1000], max(1, args.task), budget)
    with tempfile.TemporaryDirectory() as root:
        baseline = reset_peak() or peak_rss()
        before = LOCAL_DISK.snapshot()
        started = time.perf_counter()
        if args.task:
            output_rows, largest = _task(op, root, keys, args.task, budget)
            held = 0  # the input and its order go to local disk in pieces
            state_bytes = None
        else:
            output_rows, largest, state_bytes = _update(op, root, keys)
            held = 8 * args.rows
        seconds = time.perf_counter() - started
        growth = peak_rss() - baseline
        after = LOCAL_DISK.snapshot()
    chunks = -(-args.rows // aggregation.chunk_rows(op.schema, pa.table({"k": pa.array(keys)})))
    written = after.bytes_written - before.bytes_written
    figures = {
        "rows": args.rows,
        "budget_bytes": budget,
        "peak_rss_growth_bytes": growth,
        "output_rows": output_rows,
        "largest_output_batch_bytes": largest,
        "transient_bytes": growth - held,
        "arrow_peak_bytes": pa.default_memory_pool().max_memory(),
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
