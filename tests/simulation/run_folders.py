"""Where a simulation run keeps its files: a folder that the runs of a process take one after
the other, so that every run's SQLite catalog has the same path.

The process's compiled statements are shared by the catalog engines whose catalogs are in one
folder (``catalog/connection/statement_cache.py`` keys them by that folder, as local roots
are stored relative to it): a catalog in a new folder compiles every statement it runs again,
some 70 compilations in a run, a tenth of the CPU of a run of up to 40 steps when every run
had a folder of its own. Each run still starts from nothing: the shared folder is emptied
when a run ends and a run's root is a fresh folder in it (process-wide caches keyed by a
root's URI, such as the published schema files', never see a root twice).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from state_runtime.catalog import Catalog


@functools.cache
def scratch() -> str | None:
    """Where a run's folders go: a RAM-backed folder when the host has one (``/dev/shm``:
    the same files, ``fsync`` and all, without waiting for a disk), else the default."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@functools.cache
def _template_catalog() -> Path:
    """A SQLite catalog at head, migrated once per process (and removed at its exit)."""
    folder = Path(tempfile.mkdtemp(prefix="simulation-template-", dir=scratch()))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "catalog.db"
    Catalog.open(f"sqlite:///{path}", upgrade=True).close()
    assert not path.with_name(path.name + "-wal").exists()  # closed: all of it in the file
    return path


def sqlite_catalog(path: Path) -> str:
    """The URL of a fresh SQLite catalog at ``path``: a copy of the process's template (a
    run's catalog, as migrating one costs more than a few steps)."""
    shutil.copyfile(_template_catalog(), path)
    return f"sqlite:///{path}"


_taken: set[int] = set()
"""The slots held by a live run (two machines alive at once take two)."""


@functools.cache
def _slots() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="simulation-", dir=scratch()))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


class RunFolder:
    """One run's folder (``folder``, new) inside the lowest free slot (``shared``, emptied
    first), where ``catalog`` puts the run's SQLite catalog."""

    def __init__(self) -> None:
        self.slot = min(set(range(len(_taken) + 1)) - _taken)
        _taken.add(self.slot)
        self.shared = _slots() / f"slot-{self.slot}"
        shutil.rmtree(self.shared, ignore_errors=True)  # a run that failed without release
        self.shared.mkdir()
        self.folder = Path(tempfile.mkdtemp(prefix="run-", dir=self.shared))

    def catalog(self) -> str:
        """A fresh SQLite catalog's URL, at the slot's one path."""
        return sqlite_catalog(self.shared / "catalog.db")

    def release(self) -> None:
        """The run is over: its files go, and the slot is free."""
        shutil.rmtree(self.shared, ignore_errors=True)
        _taken.discard(self.slot)
