"""The invariants' caches miss nothing: a check after a file was corrupted in place (same size,
modification time put back), deleted, or a catalog row changed behind the platform's back
fails, though every load and catalog read before it was kept (``Platform.load``,
``PlatformMachine.catalog_reads``)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from state_runtime.catalog.connection.engine import parse_url, sqlite_file
from tests.simulation.machine import PlatformMachine
from tests.simulation.platform import SETTLED


@pytest.fixture
def checked() -> Iterator[PlatformMachine]:
    """A machine after two batches, checked twice with its files settled: the second check
    takes every load and every digest from the caches."""
    machine = PlatformMachine()
    try:
        machine.first_batch()
        machine.run(0, {0: {"a": 2}, 1: {"b": 3}}, None, 0)
        machine.check()
        time.sleep(2 * SETTLED / 1e9)  # the digests are kept from now on
        machine.check()
        yield machine
    finally:
        machine.platform.close()
        machine.catalog_version.close()
        machine.run_folder.release()


def _delta(machine: PlatformMachine) -> Path:
    p = machine.platform
    path = next(f for f in p.files() if f.endswith(".delta"))
    return p.folder / p.root_name / path


def _corrupt_in_place(machine: PlatformMachine) -> None:
    """One byte flipped in place: same inode, same size, modification time put back."""
    local = _delta(machine)
    before = os.stat(local)
    with open(local, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(local)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


def _delete(machine: PlatformMachine) -> None:
    _delta(machine).unlink()


def _drop_last_commit(machine: PlatformMachine) -> None:
    """The last batch's commit log rows deleted by another connection."""
    path = sqlite_file(parse_url(machine.platform.catalog_url))
    assert path is not None
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM commit_log WHERE batch_id = 1")


@pytest.mark.parametrize(
    ("change", "failure"),
    [
        (_corrupt_in_place, "retained versions do not load"),
        (_delete, "retained versions do not load"),
        (_drop_last_commit, "the catalog's last batch is 0"),
    ],
)
def test_a_change_between_two_checks_fails_the_next(
    checked: PlatformMachine, change: Callable[[PlatformMachine], None], failure: str
) -> None:
    change(checked)
    with pytest.raises(AssertionError, match=failure):
        checked.check()
