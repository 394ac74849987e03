"""A killed worker's folder of runs is reclaimed by the next worker; a live one's never is."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from state_runtime.store.local_folder import LOCK_NAME, PREFIX, make_worker_folder, reclaim

# A worker that spills a run into its folder, says where, then waits to be killed.
_WORKER = """
import sys
from state_runtime.store.disk_runs import LOCAL_DISK
folder = LOCAL_DISK.directory
open(folder + "/run.arrow", "wb").write(b"x" * 4096)
print(folder, flush=True)
sys.stdin.read()
"""


def _worker(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "STATE_LOCAL_DIR": str(parent)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_workers_folder_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    killed, dead_folder = _worker(tmp_path)
    live, live_folder = _worker(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)  # no exit handler runs
        killed.wait()
        assert (dead_folder / "run.arrow").exists()
        being_made = tmp_path / f"{PREFIX}123-abc"  # made an instant ago: no lock yet
        being_made.mkdir()
        other = tmp_path / "someone-else"
        other.mkdir()

        mine = Path(make_worker_folder(str(tmp_path)))

        assert not dead_folder.exists()
        assert (live_folder / "run.arrow").exists()
        assert being_made.exists() and other.exists()
        assert (mine / LOCK_NAME).exists()
        assert reclaim(str(tmp_path)) == []  # this process's folder is locked too
    finally:
        live.kill()
        live.wait()
    assert reclaim(str(tmp_path)) == [str(live_folder)]


def test_a_normal_exit_removes_the_folder(tmp_path: Path) -> None:
    process, folder = _worker(tmp_path)
    process.communicate("")  # stdin closed: the worker returns and its exit handler runs
    assert process.returncode == 0
    assert not folder.exists()
