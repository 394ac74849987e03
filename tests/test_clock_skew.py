"""Clock skew: the database's clock is authoritative for leases and the retention window.

Maintenance hosts whose wall clock is off run as real processes (``tests/faults/clock_shim.c``
shifts ``clock_gettime``, ``gettimeofday`` and ``time`` by LD_PRELOAD). One 15 minutes ahead
does not see a live 10-minute lease as expired; one 2 hours ahead does not see files of the
last hour as past a 1-hour window, nor a fresh unfinished write (temporary file), an
untracked new file or a batch just begun as old, in cleanup or reconciliation. Before the
catalog used the database's clock, those took the lease, deleted the files and closed the
batch's intent. A writer 2 hours behind stamps its files 2 hours old: they age from when the
catalog recorded them, so a cleanup with a 1-hour window keeps them (before, it deleted them
the moment they were superseded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
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
    retention_check,
    snapshot_pass,
)
from state_runtime.retention import RetentionPolicy, Verdict
from state_runtime.storage import LocalStorage
from state_runtime.store.checkpoint_info import CheckpointInfo
from tests.catalog.conftest import (  # noqa: F401  (fixtures)
    catalog,
    pg_catalog,
    pg_database,
    sqlite_catalog,
)
from tests.faults.shims import build_shim
from tests.maintenance.streams import KEY, VALUE, StoreStream

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
            report = cleanup_pass(fleet, policy, dry_run=False)
            answer["deleted"] = len(report.deleted)
            answer["attempt_intents"] = report.attempts.intents
        else:
            report = reconcile(fleet, policy, dry_run=False)
            answer["in_flight"] = report.in_flight
        answer["leftovers_removed"] = len(report.leftovers.removed)
print(json.dumps(answer), flush=True)
"""


@pytest.fixture(scope="module")
def clock_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim("clock_shim", tmp_path_factory.mktemp("clock"))


def on_skewed_host(
    clock_shim: Path,
    skew: timedelta,
    catalog: Catalog,  # noqa: F811
    root: str,
    do: str,
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


def snapshotted(catalog: Catalog, folder: Path) -> StoreStream:  # noqa: F811
    """Two stores, 12 versions, a verified snapshot at 12, then 2 more: the deltas up to 12
    are superseded, deletable once past the window."""
    stream = StoreStream(catalog, LocalStorage(folder), list(STORES))
    stream.run(12)
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage)
    snapshots = snapshot_pass(fleet, MaintenancePolicy(snapshot_min_deltas=5))
    assert snapshots.count(SnapshotStatus.WRITTEN) == 2
    stream.run(2)
    return stream


@pytest.fixture
def stream(tmp_path: Path, pg_catalog: Catalog) -> StoreStream:  # noqa: F811
    """:func:`snapshotted` on PostgreSQL: a host whose clock is off runs its own process, and
    only a database server has a clock of its own (SQLite's is its one host's)."""
    return snapshotted(pg_catalog, tmp_path / "checkpoint")


def files(stream: StoreStream) -> set[str]:
    return {f.path for f in stream.storage.list("state")}


@pytest.mark.postgres
def test_a_host_ahead_cannot_steal_a_live_lease(stream: StoreStream, clock_shim: Path) -> None:
    key = StoreKey(stream.root, STORES[0])
    held = stream.catalog.try_acquire_lease(key, "this-host", timedelta(minutes=10))
    assert held is not None
    answer = on_skewed_host(clock_shim, timedelta(minutes=15), stream.catalog, stream.root, "lease")
    assert answer["lease"] is None
    renewed = stream.catalog.renew_lease(held, timedelta(minutes=10))  # still the holder's
    assert renewed.owner == "this-host"


@pytest.mark.postgres
def test_a_host_ahead_deletes_nothing_inside_the_window(
    stream: StoreStream, clock_shim: Path
) -> None:
    """Nor does its attempt sweep take the intent of a batch that began a moment ago (its
    tasks may still be writing) as one to sweep and close."""
    before = files(stream)
    stream.catalog.begin_batch(
        stream.root, stream.query, stream.batch, "inflight", [(0, "default", 2)]
    )
    answer = on_skewed_host(clock_shim, timedelta(hours=2), stream.catalog, stream.root, "clean")
    assert answer["deleted"] == 0 and files(stream) == before
    assert answer["attempt_intents"] == 0
    # with the real clock two hours on, the same files are past the window and may go
    later = cleanup_pass(
        Fleet(stream.catalog, open_storage=lambda root: stream.storage),
        HOUR_WINDOW,
        dry_run=False,
        now=stream.catalog.now() + timedelta(hours=2),
    )
    assert later.deleted and files(stream) < before
    assert later.attempts.intents == 1
    for store in STORES:
        for version in (13, 14):
            assert stream.loaded(store, version) == stream.expected(store, version)


@pytest.mark.postgres
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
        dry_run=False,
        now=stream.catalog.now() + timedelta(hours=2),
    )
    assert later.leftovers.removed and not temporary.exists()


WRITER_BEHIND = """
import json, sys
from state_runtime import StateStoreProvider
from state_runtime.storage import LocalStorage

spec = json.loads(sys.argv[1])
storage = LocalStorage(spec["root"])
written = {"batches": [[], []], "lost": []}
for operator, partition, name, version, checkpoint_id in spec["latest"]:
    provider = StateStoreProvider(storage, operator, partition, name,
                                  key_schema=spec["key"], value_schema=spec["value"])
    for batch in written["batches"]:
        store = provider.get_store(version, checkpoint_id)
        store.put(("late",), (version + 1,))
        info = store.commit()
        batch.append(info.to_dict())
        version, checkpoint_id = info.version, info.checkpoint_id
    attempt = provider.get_store(version, checkpoint_id)  # a task attempt that lost
    attempt.put(("late",), (-1,))
    written["lost"].append(attempt.commit().to_dict())
print(json.dumps(written))
"""


def write_behind(
    clock_shim: Path, stream: StoreStream, behind: timedelta
) -> tuple[list[list[CheckpointInfo]], list[CheckpointInfo]]:
    """Tasks on a host whose clock runs ``behind`` write each store's next two versions (one
    row, ``late``), then an attempt at the version after whose report never reaches the
    driver: what they send the driver, by batch, and the lost attempts."""
    latest = [
        [s.operator_id, s.partition_id, s.store_name, chain[-1].version, chain[-1].checkpoint_id]
        for s, chain in stream.committed.items()
    ]
    folder = str(stream.storage.root)  # type: ignore[attr-defined]
    spec = {"root": folder, "latest": latest, "key": KEY, "value": VALUE}
    skew = str(-int(behind.total_seconds()))
    done = subprocess.run(
        [sys.executable, "-c", WRITER_BEHIND, json.dumps(spec)],
        cwd=REPO,
        env=os.environ | {"LD_PRELOAD": str(clock_shim), "STATE_CLOCK_SKEW_S": skew},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    batches = [[CheckpointInfo.from_dict(d) for d in batch] for batch in written["batches"]]
    return batches, [CheckpointInfo.from_dict(d) for d in written["lost"]]


def test_a_writer_behind_loses_no_file_inside_the_window(
    catalog: Catalog,  # noqa: F811
    tmp_path: Path,
    clock_shim: Path,
) -> None:
    """Tasks on a host 2 hours behind write versions 15 and 16 and a losing attempt at 17;
    the driver (right clock) commits the two batches and records the attempt, a snapshot
    at 16 supersedes the deltas, the driver commits 17. The writer's files claim to be two
    hours old, but the catalog recorded them a moment ago: cleanup with a 1-hour window and
    grace deletes none of them, a reader still on version 15 loads it, and the retention
    check does not call them overdue. Two hours on by the database's clock, they go."""
    stream = snapshotted(catalog, tmp_path / "checkpoint")
    batches, lost = write_behind(clock_shim, stream, timedelta(hours=2))
    for infos in batches:
        stream.catalog.commit_batch(stream.root, stream.query, stream.batch, infos)
        for info in infos:
            stream.committed[info.store].append(info)
            states = stream.states[info.store]
            states.append(states[-1] | {"late": info.version})
        stream.batch += 1
    stream.catalog.record_files(stream.root, lost)  # as the attempt sweep records them
    fleet = Fleet(stream.catalog, open_storage=lambda root: stream.storage)
    snapshots = snapshot_pass(fleet, MaintenancePolicy(snapshot_min_deltas=4))
    assert snapshots.count(SnapshotStatus.WRITTEN) == 2
    stream.run(1)  # version 17: the snapshot at 16 and delta 17 load it and 16

    behind = [*(info for infos in batches for info in infos), *lost]
    now = stream.catalog.now()
    assert all(now - info.created_at > timedelta(hours=1, minutes=55) for info in behind)
    verdicts = {v.file.path: v.verdict for v in catalog.file_verdicts(HOUR_WINDOW.retention)}
    assert {verdicts[info.path] for info in behind} == {
        Verdict.WITHIN_WINDOW,  # versions 15 and 16 (deletable_superseded by created_at)
        Verdict.ORPHAN_IN_GRACE,  # the lost attempts (deletable_orphan by created_at)
    }
    before = files(stream)
    report = cleanup_pass(fleet, HOUR_WINDOW, dry_run=False)
    assert not report.deleted and files(stream) == before
    for store in STORES:
        assert stream.loaded(store, 15) == stream.expected(store, 15)

    # 80 minutes on they are deletable, 20 minutes past the window: not yet overdue
    watch = replace(HOUR_WINDOW, overdue_after=timedelta(minutes=30))
    check = retention_check(fleet, watch, now=now + timedelta(minutes=80))
    assert check.passed, check.summary
    assert not retention_check(fleet, watch, now=now + timedelta(minutes=91)).passed
    later = cleanup_pass(fleet, HOUR_WINDOW, dry_run=False, now=now + timedelta(hours=2))
    assert {info.path for info in behind} <= {v.file.path for v in later.deleted}
    assert not files(stream) & {info.path for info in behind}
    for store in STORES:
        assert stream.loaded(store, 17) == stream.expected(store, 17)
