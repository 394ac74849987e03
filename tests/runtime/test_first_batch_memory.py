"""A running aggregation's first batch, every key new, under a 4 MiB budget in a fresh
process: beyond what the batch holds whole (its output, the updated keys' totals, and the
8-byte sort order of its rows), the task's transient memory stays within a fixed bound
whatever the batch's size, as it takes the batch in chunks of whole keys
(``aggregation.CHUNK_ROWS``). Whole-batch aggregation grew about 60 bytes a row past that:
75 MiB at 1M rows.

The whole task body (``tasks.run_partitions``, the input arriving in Spark's batches over two
state partitions) holds beyond that only the input's own column, once: holding the batches as
Spark sent them and a copy without the heartbeat rows grew about 26 bytes a row more (26 MiB
between 250k and 1M rows)."""

from __future__ import annotations

from ..bench_runs import run_benchmark

BOUND = 32 << 20


def _transient(rows: int, *task: str) -> int:
    figures = run_benchmark("bench_first_batch.py", "--rows", str(rows), "--budget-mib", "4", *task)
    assert figures["output_rows"] == rows  # every key came out
    return int(figures["transient_bytes"])


def test_first_batch_transient_memory_does_not_grow_with_its_rows() -> None:
    small, large = _transient(250_000), _transient(1_000_000)
    assert large <= BOUND, large
    assert large - small <= 8 << 20, (small, large)


def test_a_task_holds_its_input_once() -> None:
    small, large = _transient(250_000, "--task", "2"), _transient(1_000_000, "--task", "2")
    assert large <= BOUND, large
    assert large - small <= 8 << 20, (small, large)
