"""A running aggregation's first batch, every key new, under a 4 MiB budget in a fresh
process: beyond the 8-byte sort order of its rows, the update's transient memory stays within
a fixed bound whatever the batch's size, as it takes the batch in chunks of whole keys
(``aggregation.CHUNK_ROWS``) and yields each chunk's output once applied. Whole-batch
aggregation grew about 60 bytes a row past that: 75 MiB at 1M rows.

The whole task body (``tasks.run_partitions``, the input arriving in Spark's batches over two
state partitions) holds neither its input nor its sort order nor its output whole: a
partition's input goes to sorted files on local disk past ``partition_input.SPILL_ROWS`` rows
and comes back in pieces of whole keys, each piece's output handed on before the next. Its
peak growth at 4M rows stays within 8 MiB of 1M's; holding the input, the sort order and the
output whole grew 67 MiB between them (33 to 100 MB), the output streamed alone 42 MiB.

Under a small budget a step's chunk takes input rows of about half the spill threshold
(``aggregation.chunk_rows``; its change run, with an index column, about 0.75), so the
Arrow buffers a task holds at once stay a small multiple
of the threshold: chunks of ``CHUNK_ROWS`` (2 MiB of changes each) peaked at 17.7 MB, the
threshold's 17 times, a worker's peak in bench_e2e (docs/state-on-disk.md, "Issue 37, the
first batch in smaller chunks").
"""

from __future__ import annotations

from ..bench_runs import run_benchmark

BOUND = 32 << 20


BUDGET_MIB = 4
THRESHOLD = (BUDGET_MIB << 20) // 4  # disk_runs.SPILL_FRACTION


def _figures(rows: int, *task: str) -> dict[str, int]:
    figures = run_benchmark(
        "bench_first_batch.py", "--rows", str(rows), "--budget-mib", str(BUDGET_MIB), *task
    )
    assert figures["output_rows"] == rows  # every key came out
    return figures


def _transient(rows: int, *task: str) -> int:
    return int(_figures(rows, *task)["transient_bytes"])


def test_first_batch_transient_memory_does_not_grow_with_its_rows() -> None:
    small, large = _transient(250_000), _transient(1_000_000)
    assert large <= BOUND, large
    assert large - small <= 8 << 20, (small, large)


def test_a_task_holds_neither_its_input_nor_its_output_whole() -> None:
    small, large = _transient(1_000_000, "--task", "2"), _transient(4_000_000, "--task", "2")
    assert large <= 2 * BOUND, large
    assert large - small <= 8 << 20, (small, large)


def test_a_first_batch_holds_arrow_buffers_of_a_few_spill_thresholds() -> None:
    arrow_peak = _figures(1_000_000, "--task", "2")["arrow_peak_bytes"]
    assert arrow_peak <= 12 * THRESHOLD, arrow_peak / THRESHOLD
