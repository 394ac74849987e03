"""A process holds at most ``MAX_OPEN_RUNS`` run files open, whatever the runs on disk it
keeps (review of issue 37: each run on disk held its file open, so a worker holding many
stores' levels could run out of descriptors, EMFILE). In a subprocess whose descriptor limit
is below the number of runs: every run still reads whole, by scan and by lookup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from state_runtime.store.open_runs import MAX_OPEN_RUNS

REPO = Path(__file__).resolve().parent.parent
RUNS = MAX_OPEN_RUNS + 200
DESCRIPTORS = MAX_OPEN_RUNS + 100

READER = f"""
import resource, sys
import numpy as np, pyarrow as pa
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.run_writer import spill_run
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.open_runs import OPEN_RUNS
from state_runtime.store.sorted_runs import Run

resource.setrlimit(resource.RLIMIT_NOFILE, ({DESCRIPTORS}, {DESCRIPTORS}))
LOCAL_DISK.set_directory(sys.argv[1])
LOCAL_DISK.spill_bytes = 0
key, value = pa.struct([("k", pa.int64())]), pa.struct([("v", pa.int64())])
indexer = KeyIndexer(key)
runs = []
for r in range({RUNS}):
    keys = pa.StructArray.from_arrays([pa.array(np.arange(r * 10, r * 10 + 10))], fields=list(key))
    values = pa.StructArray.from_arrays([pa.array(np.arange(10) + r)], fields=list(value))
    runs.append(spill_run("s", Run.build(indexer, keys, values)[0]))
for sweep in range(2):
    for r, run in enumerate(runs):
        assert run.on_disk
        rows = [row for block in run.blocks() for row in block.rows()]
        assert rows == [((r * 10 + i,), (i + r,)) for i in range(10)], rows
        assert run.value_at(3) == (3 + r,)
        probe = pa.StructArray.from_arrays([pa.array([r * 10 + 4])], fields=list(key))
        found, values = run.find(indexer, indexer.index(probe), probe)
        assert found.tolist() == [4] and values.to_pylist() == [{{"v": 4 + r}}]
assert len(OPEN_RUNS) <= {MAX_OPEN_RUNS}
print("ok")
"""


def test_more_runs_on_disk_than_descriptors_read_whole(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", READER, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
