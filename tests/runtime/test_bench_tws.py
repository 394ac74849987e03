"""``benchmarks/bench_e2e_tws.py`` ends: Spark's ``timers`` workload keeps running no-data
batches after its last file (pending processing-time timers), so the bench stops each stream
once its data batches hold all the input, and its figures count data batches only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_e2e_tws.py"


@pytest.mark.spark
@pytest.mark.slow
def test_the_timers_workload_ends_on_every_engine_after_its_data_batches() -> None:
    env = os.environ | {"PYTHONPATH": str(BENCH.parents[1])}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--keys", "40", "--updates", "10", "--batches", "2",
         "--partitions", "2", "--engines", "spark-row,ours-row", "--workloads", "timers"],
        capture_output=True, text=True, env=env, timeout=900, check=True,
    )  # fmt: skip
    runs = {
        line.split(": ", 1)[0]: json.loads(line.split(": ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith(("spark-row: ", "ours-row: "))
    }
    assert set(runs) == {"spark-row", "ours-row"}, done.stdout
    for engine, figures in runs.items():
        # the first file and two update files: three data batches, no no-data batch
        assert len(figures["latencies"]) == len(figures["loads"]) == 3, engine
        assert all(s > 0 for s in figures["latencies"]), engine
    assert len(runs["ours-row"]["tasks"]) == len(runs["ours-row"]["catalog commit"]) == 3
    assert "timers    spark-row" in done.stdout and "Spark / ours (row)" in done.stdout
