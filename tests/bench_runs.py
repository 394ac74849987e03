"""Running a benchmark in a fresh process, as the memory tests do: a child's peak resident
memory is its own (VmHWM), whatever the test process holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
ALLOCATOR_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "262144"}
"""The allocator settings docs/state-on-disk.md gives workers that hold state on disk."""


def run_benchmark(script: str, *args: str) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` with ``args`` in a fresh process under
    :data:`ALLOCATOR_ENV`; the figures of the last line it prints, as JSON ({} when it
    prints nothing). A failing run raises CalledProcessError with its output."""
    env = os.environ | ALLOCATOR_ENV | {"PYTHONPATH": str(BENCHMARKS.parent)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    figures: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return figures
