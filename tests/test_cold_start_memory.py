"""A cold start under a small budget streams the snapshot to local disk: in a fresh process,
the peak resident memory growth of opening a store and scanning it stays within a bound set
by the budget and the batch size, not by the state. Ten times the state (200k against 2M
keys, 3.2 MB against 32 MB of Arrow rows) leaves the peak where it was, also through a
snapshot written from the runs on disk, while a whole load's grows with the state; both give
the same rows and checksum. Runs
``benchmarks/bench_cold_start.py``, with the allocator settings of docs/state-on-disk.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .bench_runs import run_benchmark

BUDGET_MIB = 4


def _run(*args: str) -> dict[str, Any]:
    return run_benchmark("bench_cold_start.py", *args)


def _cold_starts(
    root: Path, keys: int, updates: int = 10_000, *prepared: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    _run("--prepare", str(root), "--keys", str(keys), "--updates", str(updates), *prepared)
    load = ("--load", str(root), "--budget-mib", str(BUDGET_MIB))
    return _run(*load), _run(*load, "--memory")


def test_a_cold_start_peak_does_not_grow_with_the_state(tmp_path: Path) -> None:
    small, small_whole = _cold_starts(tmp_path / "small", 200_000)
    large, large_whole = _cold_starts(tmp_path / "large", 2_000_000)
    for streamed, whole in ((small, small_whole), (large, large_whole)):
        assert (streamed["rows"], streamed["checksum"]) == (whole["rows"], whole["checksum"])
        assert streamed["local_disk_bytes_written"] > 0 == whole["local_disk_bytes_written"]
        assert streamed["peak_rss_growth_bytes"] <= 2 * (BUDGET_MIB << 20), streamed
    # Ten times the state: the streamed peak stays within one budget of the small one's,
    # the whole load's grows by more than the 29 MB of rows added.
    assert large["peak_rss_growth_bytes"] <= small["peak_rss_growth_bytes"] + (BUDGET_MIB << 20)
    # Writing a snapshot from the runs on disk does not hold the state either.
    with_snapshot = "peak_rss_growth_with_snapshot_bytes"
    assert large[with_snapshot] <= small[with_snapshot] + (BUDGET_MIB << 20), (small, large)
    assert large[with_snapshot] <= 2 * (BUDGET_MIB << 20), large
    grown = large_whole["peak_rss_growth_bytes"] - small_whole["peak_rss_growth_bytes"]
    assert grown > 29_000_000, json.dumps([small_whole, large_whole])


def test_a_cold_start_peak_does_not_grow_with_the_delta(tmp_path: Path) -> None:
    """The delta on top of the snapshot as large as the state (63% of the keys updated,
    126k against 1.26M rows): streamed too, its peak stays where the small one's is."""
    small, small_whole = _cold_starts(tmp_path / "small", 200_000, 200_000)
    large, large_whole = _cold_starts(tmp_path / "large", 2_000_000, 2_000_000)
    for streamed, whole in ((small, small_whole), (large, large_whole)):
        assert (streamed["rows"], streamed["checksum"]) == (whole["rows"], whole["checksum"])
        assert streamed["peak_rss_growth_bytes"] <= 2 * (BUDGET_MIB << 20), streamed
    assert large["peak_rss_growth_bytes"] <= small["peak_rss_growth_bytes"] + (BUDGET_MIB << 20)


def test_a_cold_start_peak_does_not_grow_with_a_compressible_delta(tmp_path: Path) -> None:
    """The state a first delta of consecutive keys of value 1 (a count's first batch: 2M rows
    in 12 KB): its stored size says nothing of its rows, and read whole it grew the peak by
    164 MiB; streamed, its peak stays where the small one's is."""
    small, small_whole = _cold_starts(tmp_path / "small", 200_000, 10_000, "--no-snapshot")
    large, large_whole = _cold_starts(tmp_path / "large", 2_000_000, 10_000, "--no-snapshot")
    for streamed, whole in ((small, small_whole), (large, large_whole)):
        assert (streamed["rows"], streamed["checksum"]) == (whole["rows"], whole["checksum"])
        assert streamed["peak_rss_growth_bytes"] <= 2 * (BUDGET_MIB << 20), streamed
    assert large["peak_rss_growth_bytes"] <= small["peak_rss_growth_bytes"] + (BUDGET_MIB << 20)
