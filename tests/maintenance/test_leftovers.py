"""Writers killed mid-write (a real kill -9): what they leave, and cleanup and reconcile
removing it once older than the grace, locally and on S3."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId
from state_runtime.maintenance import MaintenancePolicy, cleanup_pass, reconcile
from state_runtime.storage import LocalStorage, PartialWrite, Storage
from tests.maintenance.streams import KEY, VALUE, StoreStream
from tests.maintenance.test_snapshots import fleet_on
from tests.s3_fixtures import CREDENTIALS, REGION, MotoS3

A = StoreId(0, 0)
POLICY = MaintenancePolicy()  # window and orphan grace: 1h


def later() -> datetime:
    """Two hours from now, past the grace: taken when the test runs, not when the module is
    collected (a long test session reaches a writer killed more than an hour after that)."""
    return datetime.now(UTC) + timedelta(hours=2)


# moto answers ListMultipartUploads with this start time for every upload (real S3 gives the
# upload's own): on moto an unfinished upload is never "too young", so the grace is checked
# on local files, where the start is the temporary file's real modification time.
MOTO_INITIATED = datetime(2010, 11, 10, 20, 48, 33, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]

# A real writer: commits the next version of store 0/0/default through the provider, but
# stops (and says so) between writing its bytes and making the file visible: locally after
# the temporary file is written and fsynced, before os.link; on S3 after the parts are
# uploaded, before CompleteMultipartUpload. The test then kills it with SIGKILL.
WRITER = """
import json, os, sys, time
from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage
from state_runtime.storage.s3 import S3Storage

spec = json.loads(sys.argv[1])

def stop_here(*args, **kwargs):
    print("stopped", flush=True)
    time.sleep(600)

if spec["kind"] == "local":
    storage = LocalStorage(spec["root"])
    os.link = stop_here
else:
    storage = S3Storage(spec["bucket"], spec["prefix"], **spec["options"])
    upload_parts = S3Storage._upload_parts
    def parts_then_stop(self, *args, **kwargs):
        upload_parts(self, *args, **kwargs)
        stop_here()
    S3Storage._upload_parts = parts_then_stop
provider = StateStoreProvider(storage, 0, 0, "default", key_schema=spec["key"],
                              value_schema=spec["value"])
store = provider.get_store(spec["version"], spec["checkpoint_id"])
store.put(("killed-writer",), (1,))
store.commit()
print("committed?!", flush=True)
"""


def kill_mid_write(spec: dict[str, Any]) -> None:
    """Run WRITER until it stops between writing and linking, then kill -9 it."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, json.dumps(spec | {"key": KEY, "value": VALUE})],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        line = child.stdout.readline() if ready else ""
        assert line.strip() == "stopped", f"writer did not stop: {line!r} {child.stderr}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def local_stream(tmp_path: Path, sqlite_catalog: Catalog) -> StoreStream:
    stream = StoreStream(sqlite_catalog, LocalStorage(tmp_path / "checkpoint"), [A])
    stream.run(2)
    return stream


@pytest.fixture
def s3_stream(moto_s3: MotoS3, sqlite_catalog: Catalog) -> StoreStream:
    # multipart from the first byte: every commit is an upload a kill can interrupt
    storage = moto_s3.storage(multipart_threshold=1)
    stream = StoreStream(sqlite_catalog, storage, [A])
    stream.run(2)
    return stream


def killed_writer(stream: StoreStream) -> None:
    latest = stream.committed[A][-1]
    spec: dict[str, Any] = {"version": latest.version, "checkpoint_id": latest.checkpoint_id}
    storage = stream.storage
    if isinstance(storage, LocalStorage):
        spec |= {"kind": "local", "root": str(storage.root)}
    else:
        options = {
            "endpoint_url": storage.settings.endpoint_url,
            "region_name": REGION,
            "multipart_threshold": 1,
            **CREDENTIALS,
        }
        spec |= {"kind": "s3", "bucket": storage.bucket, "prefix": storage.prefix}
        spec["options"] = options
    kill_mid_write(spec)


def leftovers(storage: Storage) -> list[PartialWrite]:
    return list(storage.partial_writes(["state"]))


def visible(storage: Storage) -> set[str]:
    return {f.path for f in storage.list("state")}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def stream(request: pytest.FixtureRequest) -> Iterator[StoreStream]:
    yield request.getfixturevalue(f"{request.param}_stream")


def test_a_killed_writer_leaves_an_invisible_partial_write(stream: StoreStream) -> None:
    before = visible(stream.storage)
    killed_writer(stream)
    (left,) = leftovers(stream.storage)
    assert left.path.startswith(A.directory + "/")
    assert visible(stream.storage) == before  # no listing shows it, nothing was committed
    if isinstance(stream.storage, LocalStorage):
        temporary = stream.storage.root / left.path
        assert temporary.name.startswith(".tmp-") and temporary.stat().st_size == left.size > 0
    for version in (1, 2):
        assert stream.loaded(A, version) == stream.expected(A, version)


def test_cleanup_removes_a_killed_writers_leftover_once_older_than_the_grace(
    stream: StoreStream,
) -> None:
    killed_writer(stream)
    (left,) = leftovers(stream.storage)
    where = f"{stream.root}/{left.path}"
    fleet = fleet_on(stream)

    if left.started != MOTO_INITIATED:
        young = cleanup_pass(fleet, POLICY, dry_run=False)
        assert young.leftovers.young == [where] and not young.leftovers.removed
        assert leftovers(stream.storage) == [left]

    dry = cleanup_pass(fleet, POLICY, now=later())
    assert dry.leftovers.removed == [where]
    assert leftovers(stream.storage) == [left]

    done = cleanup_pass(fleet, POLICY, dry_run=False, now=later())
    assert done.leftovers.removed == [where] and not done.leftovers.failed
    assert leftovers(stream.storage) == []
    assert done.run_id is not None
    run = stream.catalog.run(done.run_id)
    assert run is not None and run.counts["leftovers_removed"] == 1
    for version in (1, 2):
        assert stream.loaded(A, version) == stream.expected(A, version)
    stream.run(1)  # the store goes on
    assert stream.loaded(A, 3) == stream.expected(A, 3)


def test_reconcile_removes_a_killed_writers_leftover_once_older_than_the_grace(
    stream: StoreStream,
) -> None:
    killed_writer(stream)
    fleet = fleet_on(stream)
    if isinstance(stream.storage, LocalStorage):  # see MOTO_INITIATED
        young = reconcile(fleet, POLICY)
        assert len(young.leftovers.young) == 1 and len(leftovers(stream.storage)) == 1
    dry = reconcile(fleet, POLICY, now=later(), dry_run=True)
    assert len(dry.leftovers.removed) == 1 and len(leftovers(stream.storage)) == 1
    done = reconcile(fleet, POLICY, now=later())
    assert len(done.leftovers.removed) == 1 and leftovers(stream.storage) == []
    assert not done.untracked  # the unfinished write was never a checkpoint file


def test_only_temporary_files_are_removed_as_partial_writes(
    local_stream: StoreStream,
) -> None:
    committed = local_stream.committed[A][-1].path
    fake = PartialWrite(committed, datetime(2020, 1, 1, tzinfo=UTC), 1)
    with pytest.raises(InvalidArgument, match="not a temporary file"):
        local_stream.storage.abort_partial_writes([fake])
    assert committed in visible(local_stream.storage)
