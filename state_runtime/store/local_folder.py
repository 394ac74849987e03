"""A worker process's folder of runs on local disk, and the reclaiming of dead workers' folders.

Spark ends its Python workers without running their exit handlers (the daemon kills them, an
executor is lost, the host stops a container), so a folder removed only at exit outlives its
process and local disk fills with caches nobody reads. Each folder therefore holds a lock
(``flock`` on :data:`LOCK_NAME`) for as long as its process lives: the operating system
releases it however the process ends, across PID namespaces too. Making a folder first
removes every sibling folder whose lock can be taken: its process is gone, and its runs were
only a cache of what storage holds. A folder without a lock file (being made this instant)
is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "state_runtime-"
"""Every worker folder's name starts so (then the process id, then a random part)."""

LOCK_NAME = ".owner.lock"

_held: list[int] = []
"""The descriptors holding this process's folders' locks, open until the process ends."""


def _lock(path: str) -> int | None:
    """The descriptor holding ``path``'s exclusive lock, or None if another process holds it
    or the file does not exist."""
    try:
        descriptor = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def reclaim(parent: str) -> list[str]:
    """Remove the worker folders under ``parent`` whose process is gone; the ones removed."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(parent):
            if not (entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False)):
                continue
            descriptor = _lock(os.path.join(entry.path, LOCK_NAME))
            if descriptor is None:
                continue
            try:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
            finally:
                os.close(descriptor)
    return removed


def make_worker_folder(parent: str | None) -> str:
    """A new folder of this process's runs under ``parent`` (None: the temporary folder),
    locked for the process's life and removed at a normal exit; dead workers' folders under
    the same parent are removed first."""
    parent = parent or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    reclaim(parent)
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)
    # Locked under a private name, then renamed: no other process can take the lock first.
    private = os.path.join(folder, f"{LOCK_NAME}.{os.getpid()}")
    descriptor = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(private, os.path.join(folder, LOCK_NAME))
    _held.append(descriptor)
    atexit.register(shutil.rmtree, folder, True)
    return folder
