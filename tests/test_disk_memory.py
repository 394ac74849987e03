"""A store four times larger than its budget, built, looked up, updated and committed in a
fresh process: its peak resident memory grows by at most 3x the budget over its own baseline
(after imports and a warm-up), and its final state equals the same run's in memory.

The bound: cached versions (the budget), the block cache (a quarter of it) and the transient
work of one merge or lookup (a few blocks, and a commit's own change arrays: here 50k rows,
0.8 MB) stay well under 3x the budget; ``make bench-disk`` runs the issue's 8M keys under
32 MiB. The worker runs with the system allocator and a fixed mmap threshold
(docs/state-on-disk.md): glibc's default raises its threshold after large frees and keeps
the freed memory, which would measure the allocator, not the store."""

from __future__ import annotations

from typing import Any

from .bench_runs import run_benchmark

BUDGET_MIB = 4


def _run(*extra: str) -> dict[str, Any]:
    args = ["--keys", "1000000", "--budget-mib", str(BUDGET_MIB), "--batches", "3"]
    return run_benchmark("bench_disk.py", *args, "--chunk", "50000", *extra)


def test_memory_stays_within_three_budgets_and_the_state_equals_in_memory() -> None:
    on_disk = _run()
    in_memory = _run("--memory")
    assert on_disk["local_disk_bytes_written"] > on_disk["state_bytes"]  # it really spilled
    assert in_memory["local_disk_bytes_written"] == 0
    assert (on_disk["rows"], on_disk["checksum"]) == (in_memory["rows"], in_memory["checksum"])
    assert on_disk["peak_rss_growth_bytes"] <= 3 * (BUDGET_MIB << 20), on_disk
