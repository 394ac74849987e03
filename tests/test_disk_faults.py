"""Disk full and I/O errors on the state folder, injected for real.

- ENOSPC from a real, full filesystem: a small tmpfs mounted for the test (we run as root).
- ENOSPC, EDQUOT and EIO on each step of a write (the temporary file's write, its fsync, the
  link, the rename that replaces a refused link, the directory's fsync after the link):
  this kernel has no device-mapper (whose error target gives a real EIO), so a writer process
  runs with a shim (``tests/faults/oserror_shim.c``, LD_PRELOAD) that fails those C library
  calls below the state folder.

Each time: a typed error naming the errno, no torn or half-recorded version (the catalog
never hears of it, no temporary file is left, no visible file is partial), and the store is
usable again once the fault is gone.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from state_runtime import StateStoreProvider
from state_runtime.catalog import Catalog
from state_runtime.errors import CannotCommit
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage
from state_runtime.store.checkpoint_format import decode
from state_runtime.store.schema_files import fetch
from tests.catalog.conftest import sqlite_catalog  # noqa: F401  (fixture)
from tests.faults.shims import build_shim
from tests.maintenance.streams import KEY, VALUE, StoreStream

REPO = Path(__file__).resolve().parents[1]
A = StoreId(0, 0)

# Commits the next version of store 0/0/default with ``rows`` fresh rows, then records it in
# the catalog as batch ``batch`` (as a driver does once the task succeeded).
WRITER = """
import json, os, sys
from state_runtime import StateStoreProvider
from state_runtime.catalog import Catalog
from state_runtime.errors import StateStoreError
from state_runtime.storage import LocalStorage

spec = json.loads(sys.argv[1])
storage = LocalStorage(spec["root"])
provider = StateStoreProvider(storage, 0, 0, "default", key_schema=spec["key"],
                              value_schema=spec["value"])
store = provider.get_store(spec["version"], spec["checkpoint_id"])
for n in range(spec["rows"]):
    store.put((f"fault-{n}",), (n,))
try:
    info = store.commit()
except StateStoreError as exc:
    print("error", type(exc).__name__, exc, flush=True)
    sys.exit(3)
with Catalog.open(spec["catalog"]) as catalog:
    catalog.commit_batch(storage.uri, "query-1", spec["batch"], [info])
print("committed", info.version, info.checkpoint_id, flush=True)
"""


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim("oserror_shim", tmp_path_factory.mktemp("shim"))


def write_next(
    stream: StoreStream, *, rows: int = 20, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    latest = stream.committed[A][-1]
    spec = {
        "root": str(stream.storage.root),  # type: ignore[attr-defined]
        "catalog": stream.catalog.engine.url.render_as_string(hide_password=False),
        "version": latest.version,
        "checkpoint_id": latest.checkpoint_id,
        "batch": stream.batch,
        "rows": rows,
        "key": KEY,
        "value": VALUE,
    }
    return subprocess.run(
        [sys.executable, "-c", WRITER, json.dumps(spec)],
        cwd=REPO,
        env=os.environ | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_nothing_half_done(stream: StoreStream, version: int) -> None:
    """The catalog still ends at ``version - 1``; no temporary file is left; any file of
    ``version`` that is visible is whole (a failed directory fsync comes after the link)."""
    catalog, storage = stream.catalog, stream.storage
    assert {r.version for r in catalog.latest_committed(stream.root).values()} == {version - 1}
    assert list(storage.partial_writes(["state"])) == []
    for info in storage.list("state"):
        if info.path.rsplit("/", 1)[-1].startswith(f"{version}_"):
            # raises on a torn file (a delta's schema id resolves through schemas/)
            decode(storage.read(info.path), info.path, schemas=lambda i: fetch(storage, i))
            assert info.path not in catalog.known_paths(stream.root)


def assert_usable_again(stream: StoreStream, version: int) -> None:
    done = write_next(stream)
    assert done.returncode == 0, done.stdout + done.stderr
    _, committed, checkpoint_id = done.stdout.split()
    assert int(committed) == version
    provider = StateStoreProvider(
        stream.storage, 0, 0, "default", key_schema=KEY, value_schema=VALUE
    )
    loaded = provider.get_read_store(version, checkpoint_id)
    assert loaded.get(("fault-19",)) == (19,)
    for key, value in stream.expected(A, version - 1).items():  # built on the last version
        assert loaded.get((key,)) == (value,)


@pytest.fixture
def stream(tmp_path: Path, sqlite_catalog: Catalog) -> StoreStream:  # noqa: F811
    stream = StoreStream(sqlite_catalog, LocalStorage(tmp_path / "checkpoint"), [A])
    stream.run(2)
    return stream


FAULTS = {
    "write EIO": "write:5",
    "write ENOSPC": "write:28",
    "write EDQUOT": "write:122",
    "fsync EIO": "fsync:5",
    "fsync ENOSPC": "fsync:28",
    "link EIO": "link:5",
    "link ENOSPC": "link:28",
    "link EDQUOT": "link:122",
    "rename EIO (after a refused link)": "link:1,rename:5",
    "directory fsync EIO after the link": "dirfsync:5",
}


@pytest.mark.parametrize("fault", list(FAULTS.values()), ids=list(FAULTS))
def test_an_io_error_on_any_step_of_a_write(stream: StoreStream, shim: Path, fault: str) -> None:
    code = int(fault.rsplit(":", 1)[1])
    env = {
        "LD_PRELOAD": str(shim),
        "STATE_FAULT": fault,
        "STATE_FAULT_DIR": str(stream.storage.root),  # type: ignore[attr-defined]
    }
    failed = write_next(stream, env=env)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert failed.stdout.startswith(
        f"error {CannotCommit.__name__} [{CannotCommit.code}] commit failed"
    )
    assert os.strerror(code) in failed.stdout and "file=state/0/0/default/3_" in failed.stdout
    assert_nothing_half_done(stream, 3)
    assert_usable_again(stream, 3)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (a real filesystem that fills up); unmounted afterwards."""
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(folder: Path) -> Path:
    """Fill the filesystem of ``folder`` to the last byte; the filler file."""
    filler = folder / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(os.urandom(64 * 1024))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_then_space_returns(
    full_disk: Path,
    sqlite_catalog: Catalog,  # noqa: F811
) -> None:
    stream = StoreStream(sqlite_catalog, LocalStorage(full_disk / "checkpoint"), [A])
    stream.run(2)
    filler = fill(full_disk)
    failed = write_next(stream, rows=2000)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "CannotCommit" in failed.stdout and "No space left on device" in failed.stdout
    assert_nothing_half_done(stream, 3)
    for version in (1, 2):  # what was committed still loads, from the full disk
        assert stream.loaded(A, version) == stream.expected(A, version)
    filler.unlink()
    assert_usable_again(stream, 3)
