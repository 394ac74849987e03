"""The reconciliation sweep: untracked files are found, verified and recorded."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from state_runtime.catalog import Verdict
from state_runtime.maintenance import MaintenancePolicy, cleanup_pass, reconcile
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
