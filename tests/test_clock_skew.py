"""Clock skew: the database's clock is authoritative for leases and the retention window.

Maintenance hosts whose wall clock is off run as real processes (``tests/faults/clock_shim.c``
shifts ``clock_gettime``, ``gettimeofday`` and ``time`` by LD_PRELOAD). One 15 minutes ahead
does not see a live 10-minute lease as expired; one 2 hours ahead does not see files of the
last hour as past a 1-hour window, nor a fresh unfinished write (temporary file) or an
untracked new file as old, in cleanup or reconciliation; a writer 2 hours behind writes files
that look old, and still no needed file goes. Before the catalog used the database's clock,
the first ones took the lease and deleted the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from state_runtime.catalog import Catalog, StoreKey
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    MaintenancePolicy,
    SnapshotStatus,
    cleanup_pass,
    snapshot_pass,
)
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage
from tests.catalog.conftest import pg_catalog, pg_database  # noqa: F401  (fixtures)
from tests.faults.shims import build_shim
from tests.maintenance.streams import KEY, VALUE, StoreStream

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[1]
STORES = [StoreId(0, 0), StoreId(0, 1)]
HOUR_WINDOW = MaintenancePolicy(
    retention=RetentionPolicy(window=timedelta(hours=1), orphan_grace=timedelta(hours=1))
)

SKEWED_HOST = """
import json, sys
from datetime import UTC, datetime, timedelta
from state_runtime.catalog import Catalog, StoreKey
from state_runtime.identity import StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass, reconcile
from state_runtime.retention import RetentionPolicy
from state_runtime.storage import LocalStorage

spec = json.loads(sys.argv[1])
with Catalog.open(spec["url"]) as catalog:
    local, db = datetime.now(UTC), catalog.now()
    answer = {"skew_s": (local - db).total_seconds()}
    if spec["do"] == "lease":
        key = StoreKey(spec["root"], StoreId(0, 0))
        lease = catalog.try_acquire_lease(key, "skewed-host", timedelta(minutes=10))
        answer["lease"] = None if lease is None else lease.owner
    else:
        policy = MaintenancePolicy(retention=RetentionPolicy(
            window=timedelta(hours=1), orphan_grace=timedelta(hours=1)))
        storage = LocalStorage(spec["path"])
        fleet = Fleet(catalog, open_storage=lambda root: storage, owner="skewed-host")
        if spec["do"] == "clean":
            report = cleanup_pass(fleet, policy, execute=True)
            answer["deleted"] = len(report.deleted)
        else:
            report = reconcile(fleet, policy, execute=True)
            answer["in_flight"] = report.in_flight
        answer["leftovers_removed"] = len(report.leftovers.removed)
print(json.dumps(answer), flush=True)
"""


@pytest.fixture(scope="module")
def clock_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim("clock_shim", tmp_path_factory.mktemp("clock"))


def on_skewed_host(
    clock_shim: Path, skew: timedelta, catalog: Catalog, root: str, do: str
) -> dict[str, object]:
    spec = {
        "url": catalog.engine.url.render_as_string(hide_password=False),
        "root": root,
        "path": unquote(urlsplit(root).path),  # the folder (LocalStorage takes a path)
    }
    done = subprocess.run(
        [sys.executable, "-c", SKEWED_HOST, json.dumps(spec | {"do": do})],
        cwd=REPO,
        env=os.environ
        | {"LD_PRELOAD": str(clock_shim), "STATE_CLOCK_SKEW_S": str(int(skew.total_seconds()))},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    # the process's clock really was off, and the catalog corrected for it
    assert abs(float(answer["skew_s"]) - skew.total_seconds()) < 5  # type: ignore[arg-type]
    return answer


@pytest.fixture
def stream(tmp_path: Path, pg_catalog: Catalog) -> StoreStream:  # noqa: F811
    """Two stores, 12 versions, a verified snapshot at 12, then 2 more: the deltas up to 12
    are superseded, deletable once past the window."""
    stream = StoreStream(pg_catalog, LocalStorage(tmp_path / "checkpoint"), list(STORES))
    stream.run(12)
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage)
    snapshots = snapshot_pass(fleet, MaintenancePolicy(snapshot_min_deltas=5))
    assert snapshots.count(SnapshotStatus.WRITTEN) == 2
    stream.run(2)
    return stream


def files(stream: StoreStream) -> set[str]:
    return {f.path for f in stream.storage.list("state")}


def test_a_host_ahead_cannot_steal_a_live_lease(stream: StoreStream, clock_shim: Path) -> None:
    key = StoreKey(stream.root, STORES[0])
    held = stream.catalog.try_acquire_lease(key, "this-host", timedelta(minutes=10))
    assert held is not None
    answer = on_skewed_host(clock_shim, timedelta(minutes=15), stream.catalog, stream.root, "lease")
    assert answer["lease"] is None
    renewed = stream.catalog.renew_lease(held, timedelta(minutes=10))  # still the holder's
    assert renewed.owner == "this-host"


def test_a_host_ahead_deletes_nothing_inside_the_window(
    stream: StoreStream, clock_shim: Path
) -> None:
    before = files(stream)
    answer = on_skewed_host(clock_shim, timedelta(hours=2), stream.catalog, stream.root, "clean")
    assert answer["deleted"] == 0 and files(stream) == before
    # with the real clock two hours on, the same files are past the window and may go
    later = cleanup_pass(
        Fleet(stream.catalog, open_storage=lambda root: stream.storage),
        HOUR_WINDOW,
        execute=True,
        now=stream.catalog.now() + timedelta(hours=2),
    )
    assert later.deleted and files(stream) < before
    for store in STORES:
        for version in (13, 14):
            assert stream.loaded(store, version) == stream.expected(store, version)


def test_a_host_ahead_sweeps_no_fresh_write(stream: StoreStream, clock_shim: Path) -> None:
    """A temporary file a writer left a minute ago (unlocked: a killed writer's, or one in
    the instant before its lock) and a new file the catalog has not recorded yet: to a
    maintenance host two hours ahead both are young, by the database's clock; its cleanup
    and its reconciliation leave them. Two hours on by the database, both may go."""
    folder = stream.storage.root / STORES[0].directory  # type: ignore[attr-defined]
    temporary = folder / ".tmp-skewtest.part"
    temporary.write_bytes(b"half a file")
    fresh = stream.write(STORES[0])[0].path  # written, not recorded: a batch in flight
    for do in ("clean", "reconcile"):
        answer = on_skewed_host(clock_shim, timedelta(hours=2), stream.catalog, stream.root, do)
        assert answer["leftovers_removed"] == 0 and temporary.exists(), do
    assert answer["in_flight"] == [fresh], answer  # seen, too young to record as an orphan
    later = cleanup_pass(
        Fleet(stream.catalog, open_storage=lambda root: stream.storage),
        HOUR_WINDOW,
        execute=True,
        now=stream.catalog.now() + timedelta(hours=2),
    )
    assert later.leftovers.removed and not temporary.exists()


WRITER_BEHIND = """
import json, sys
from state_runtime import StateStoreProvider
from state_runtime.catalog import Catalog
from state_runtime.storage import LocalStorage
spec = json.loads(sys.argv[1])
storage = LocalStorage(spec["root"])
provider = StateStoreProvider(storage, 0, 0, "default", key_schema=spec["key"],
                              value_schema=spec["value"])
store = provider.get_store(spec["version"], spec["checkpoint_id"])
store.put(("late",), (1,))
info = store.commit()
with Catalog.open(spec["url"]) as catalog:
    catalog.commit_batch(storage.uri, "query-1", spec["batch"], [info])
print(json.dumps({"version": info.version, "created_at": info.created_at.isoformat()}))
"""


def test_a_writer_behind_loses_no_needed_file(stream: StoreStream, clock_shim: Path) -> None:
    """A writer (and its driver) two hours behind: its file looks two hours old to everyone,
    past the window; it is needed, so cleanup keeps it, and every retained version loads."""
    latest = stream.committed[STORES[0]][-1]
    spec = {
        "root": str(stream.storage.root),  # type: ignore[attr-defined]
        "url": stream.catalog.engine.url.render_as_string(hide_password=False),
        "version": latest.version,
        "checkpoint_id": latest.checkpoint_id,
        "batch": stream.batch,
        "key": KEY,
        "value": VALUE,
    }
    done = subprocess.run(
        [sys.executable, "-c", WRITER_BEHIND, json.dumps(spec)],
        cwd=REPO,
        env=os.environ | {"LD_PRELOAD": str(clock_shim), "STATE_CLOCK_SKEW_S": "-7200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    age = stream.catalog.now() - datetime.fromisoformat(written["created_at"])
    assert age > timedelta(hours=1, minutes=55)  # the file claims to be two hours old
    before = files(stream)
    report = cleanup_pass(
        Fleet(stream.catalog, open_storage=lambda root: stream.storage), HOUR_WINDOW, execute=True
    )
    assert not report.deleted and files(stream) == before  # the rest is inside the window
    store = stream.provider(STORES[0]).get_read_store(15)
    assert store.get(("late",)) == (1,)
