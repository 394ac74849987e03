"""The reconciliation sweep: untracked files are found, verified and recorded."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from state_runtime import StateStoreProvider
from state_runtime.catalog import Verdict
from state_runtime.maintenance import MaintenancePolicy, cleanup_pass, reconcile
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy()


def test_untracked_files_are_recorded_and_then_cleaned(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(3)
    store = stream.stores[0]
    lost, _ = stream.write(store)  # a task died after writing, before recording
    stream.providers[store].drop_cache()
    stream.run(1)  # version 4 commits with another id: the lost file is an orphan
    foreign = stream.storage.root / store.directory / "notes.txt"
    foreign.write_text("not ours")
    garbage = stream.storage.root / f"state/0/1/default/9_{'a' * 32}.delta"
    garbage.write_bytes(b"garbage")
    # a minute old: older than a zero min age by any client's estimate of the database's clock
    # (stamped this instant, a file is old only if that estimate is not behind the disk's
    # clock), younger than the default min age
    minute_ago = time.time() - 60
    for path in (stream.storage.root / lost.path, foreign, garbage):
        os.utime(path, (minute_ago, minute_ago))

    dry = reconcile(fleet_on(stream), POLICY, dry_run=True, min_age=timedelta(0))
    assert set(dry.untracked) == {lost.path, f"state/0/1/default/9_{'a' * 32}.delta"}
    assert dry.recorded == {}
    assert dry.foreign == [f"{store.directory}/notes.txt"]
    assert "corrupt checkpoint file" in dry.unreadable[f"state/0/1/default/9_{'a' * 32}.delta"]

    young = reconcile(fleet_on(stream), POLICY)  # default min age: everything is too young
    assert set(young.in_flight) == set(young.untracked) and young.recorded == {}

    report = reconcile(fleet_on(stream), POLICY, min_age=timedelta(0))
    assert report.recorded == {lost.path: "orphan"}
    state = stream.storage.root / "state"  # reconcile lists the state, not schemas/
    assert report.listed == len([p for p in state.rglob("*") if p.is_file()])
    again = reconcile(fleet_on(stream), POLICY, min_age=timedelta(0))
    assert again.untracked == [garbage.relative_to(stream.storage.root).as_posix()]

    later = datetime.now(UTC) + timedelta(days=1)
    plan = cleanup_pass(fleet_on(stream), POLICY, now=later)
    verdicts = {v.file.path: v.verdict for v in plan.planned}
    assert verdicts[lost.path] is Verdict.DELETABLE_ORPHAN
    assert foreign.exists() and garbage.exists()


def test_a_delta_whose_schema_is_not_published_is_unreadable_not_recorded(
    make_stream: Callable[..., StoreStream],
) -> None:
    """A delta written under a schema this root's schemas/ folder does not hold (its writer
    published it elsewhere, or not yet): reconcile cannot parse its rows, so it reports the
    file as unreadable, naming the schema, and does not record it."""
    stream = make_stream()
    stream.run(2)
    store = stream.stores[0]
    elsewhere = LocalStorage(stream.storage.root.parent / "elsewhere")
    writer = StateStoreProvider(
        elsewhere,
        store.operator_id,
        store.partition_id,
        store.store_name,
        key_schema="user string",
        value_schema="count bigint, note string",
    )
    handle = writer.get_store(0)
    handle.put(("user1",), (1, "x"))
    written = handle.commit()
    assert written.path.endswith(".delta")
    copied = stream.storage.root / written.path
    copied.write_bytes((elsewhere.root / written.path).read_bytes())

    report = reconcile(fleet_on(stream), POLICY, min_age=timedelta(0))
    assert written.path in report.untracked and written.path not in report.recorded
    reason = report.unreadable[written.path]
    assert "rows cannot be parsed" in reason and "schema" in reason
    assert written.path not in fleet_on(stream).catalog.known_paths(stream.root)
