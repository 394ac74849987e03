"""A killed worker's folder of runs is reclaimed by the next worker; a live one's never is."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from state_runtime.store import local_folder
from state_runtime.store.local_folder import (
    LOCK_NAME,
    MAKING,
    PREFIX,
    STALE_SECONDS,
    make_worker_folder,
    reclaim,
)

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
        being_made = tmp_path / f"{MAKING}abc"  # made an instant ago: no lock yet
        being_made.mkdir()
        old_lockless = [tmp_path / f"{MAKING}old", tmp_path / f"{PREFIX}1-old"]  # died making
        for folder in old_lockless:
            folder.mkdir()
            long_ago = time.time() - STALE_SECONDS - 60
            os.utime(folder, (long_ago, long_ago))
        other = tmp_path / "someone-else"
        other.mkdir()

        mine = Path(make_worker_folder(str(tmp_path)))

        assert not dead_folder.exists()
        assert not any(folder.exists() for folder in old_lockless)
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


def test_another_users_folder_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling whose lock file cannot be opened (another user's folder, mode 0700) is
    skipped: making this worker's folder does not fail."""
    theirs = tmp_path / f"{PREFIX}1-theirs"
    theirs.mkdir()
    (theirs / LOCK_NAME).touch()
    real_open = os.open

    def refusing(path: str, *args: int) -> int:
        if str(path).startswith(str(theirs)):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args)

    monkeypatch.setattr(local_folder.os, "open", refusing)
    assert Path(make_worker_folder(str(tmp_path))).is_dir()
    assert theirs.exists()


_FORKS = """
import os, sys
from state_runtime.store.disk_runs import LOCAL_DISK
mine = LOCAL_DISK.directory
child = os.fork()
if child == 0:  # a forked worker: its own folder; its normal exit leaves its parent's alone
    print(LOCAL_DISK.directory != mine and os.path.isdir(LOCAL_DISK.directory), flush=True)
    sys.exit(0)
os.waitpid(child, 0)
print(os.path.isdir(mine), flush=True)
"""


def test_a_forked_child_makes_its_own_folder_and_leaves_its_parents(tmp_path: Path) -> None:
    env = {**os.environ, "STATE_LOCAL_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _FORKS], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True"]
    assert not list(tmp_path.iterdir())  # both gone at their exits
