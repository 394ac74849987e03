"""A worker process's folder of runs on local disk, and the reclaiming of dead workers' folders.

Spark ends its Python workers without running their exit handlers (the daemon kills them, an
executor is lost, the host stops a container), so a folder removed only at exit outlives its
process and local disk fills with caches nobody reads. Each folder therefore holds a lock
(``flock`` on :data:`LOCK_NAME`) for as long as its process lives: the operating system
releases it however the process ends, across PID namespaces too. A folder is made and locked
under a private name, then renamed into place, so every worker folder has its lock from the
moment it can be seen. Making a folder first removes every sibling whose lock can be taken
(its process is gone; its runs were only a cache of what storage holds), and any sibling
without a lock that is older than :data:`STALE_SECONDS` (made by a process that died while
making it, or by a version without locks). A folder another user owns, which cannot be opened,
is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import time

PREFIX = "state_runtime-"
"""Every worker folder's name starts so (then the process id, then a random part)."""

MAKING = ".state_runtime-making-"
"""A folder being made and locked, before its rename into place."""

LOCK_NAME = ".owner.lock"

STALE_SECONDS = 3600
"""A folder without a lock older than this is a dead process's."""

_held: list[int] = []
"""The descriptors holding this process's folders' locks, open until the process ends."""


def _lock(path: str) -> int | None:
    """The descriptor holding ``path``'s exclusive lock; None if another process holds it, or
    it cannot be opened (``FileNotFoundError``: no lock file; another user's folder)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def _remove_if_dead(entry: os.DirEntry[str], now: float) -> bool:
    lock = os.path.join(entry.path, LOCK_NAME)
    if not os.path.lexists(lock):
        try:
            stale = now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS
        except OSError:
            return False
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
        return stale
    descriptor = _lock(lock)
    if descriptor is None:
        return False
    try:
        shutil.rmtree(entry.path, ignore_errors=True)
    finally:
        os.close(descriptor)
    return True


def reclaim(parent: str) -> list[str]:
    """Remove the worker folders under ``parent`` whose process is gone; the ones removed."""
    removed, now = [], time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith((PREFIX, MAKING)):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and _remove_if_dead(entry, now):
                    removed.append(entry.path)
    return removed


def _remove_if_mine(folder: str, pid: int) -> None:
    """The exit handler: a forked child that exits does not remove its parent's folder."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def make_worker_folder(parent: str | None) -> str:
    """A new folder of this process's runs under ``parent`` (None: the temporary folder),
    locked for the process's life and removed at a normal exit; dead workers' folders under
    the same parent are removed first."""
    parent = parent or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    reclaim(parent)
    pid = os.getpid()
    making = tempfile.mkdtemp(prefix=MAKING, dir=parent)
    lock = os.path.join(making, LOCK_NAME)
    descriptor = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    _held.append(descriptor)
    folder = os.path.join(parent, f"{PREFIX}{pid}-{os.path.basename(making)[len(MAKING) :]}")
    os.rename(making, folder)
    atexit.register(_remove_if_mine, folder, pid)
    return folder
