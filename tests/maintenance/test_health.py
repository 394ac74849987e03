"""Health figures from the catalog, checked against the files on disk; no storage request."""

from __future__ import annotations

from collections.abc import Callable

from state_runtime.maintenance import FleetTotals, MaintenancePolicy, snapshot_pass, store_reports
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_snapshots import fleet_on

POLICY = MaintenancePolicy(snapshot_min_deltas=5)


def test_figures_match_the_files(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(6)
    snapshot_pass(fleet_on(stream), POLICY)
    orphan = stream.abandoned_attempt(stream.stores[0])
    stream.run(3)
    other = make_stream("other")
    other.run(2)
    stream.storage.requests.reset()
    reports = {r.key: r for r in store_reports(fleet_on(stream), POLICY)}
    assert stream.storage.requests.counts == {}
    assert len(reports) == 6
    disk = stream.storage.root
    for store in stream.stores:
        report = reports[stream.key(store)]
        h, figures = report.health, report.figures()
        assert h.latest == stream.committed[store][-1].ref
        assert h.deltas_since_snapshot == 3 and h.last_snapshot_version == 6
        assert h.state_rows == len(stream.expected(store, 9))
        # a cold load reads the snapshot at 6 and deltas 7..9
        needed = [*disk.joinpath(store.directory).glob("6_*.snapshot")] + [
            disk / stream.committed[store][v - 1].path for v in (7, 8, 9)
        ]
        assert report.recovery.files == 4
        assert report.recovery.bytes == sum(p.stat().st_size for p in needed)
        files = [p for p in disk.joinpath(store.directory).iterdir()]
        assert h.live_files == len(files)
        assert h.live_bytes == sum(p.stat().st_size for p in files)
        assert figures["recovery_bytes"] == report.recovery.bytes
        assert 0 <= figures["commit_lag_seconds"] < 600
    first = reports[stream.key(stream.stores[0])].health
    assert (first.orphan_files, first.orphan_bytes) == (1, orphan.bytes_written)
    narrowed = store_reports(fleet_on(stream), POLICY, only=[other.key(other.stores[0])])
    assert [r.key for r in narrowed] == [other.key(other.stores[0])]
    totals = FleetTotals.of(list(reports.values()))
    assert totals.stores == 6 and totals.orphan_files == 1
    assert totals.max_deltas_since_snapshot == 3  # the other root: 2
