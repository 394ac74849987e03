"""The coordinator's records in a real catalog: which worker holds each store's copy, as the
driver records it from the task reports in the batch's commit transaction."""

from __future__ import annotations

from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.runtime import coordinator
from state_runtime.runtime.tasks import TaskReport
from tests.catalog.factory import Stream

A, B = StoreId(0, 0), StoreId(0, 1)


def _report(stream: Stream, store: StoreId, worker: str) -> TaskReport:
    return TaskReport(
        run="r",
        info=stream.delta(store),
        rows_in=1,
        keys_updated=1,
        load_source="memory",
        deltas_applied=0,
        load_ms=0.0,
        task_ms=1.0,
        attempt=0,
        worker=worker,
    )


def _commit(stream: Stream, reports: list[TaskReport]) -> None:
    infos = [r.info for r in reports]
    stream.catalog.commit_batch(
        stream.root, stream.query, stream.batch, infos, holders=coordinator.holders(reports)
    )
    for info in infos:
        stream.committed.setdefault(info.store, []).append(info)
    stream.batch += 1


def test_the_commit_records_the_writer_of_each_store_as_its_holder(
    sqlite_catalog_url: str,
) -> None:
    with Catalog.open(sqlite_catalog_url, upgrade=True) as catalog:
        stream = Stream(catalog, [A, B])
        first = [_report(stream, A, "host:1"), _report(stream, B, "host:1")]
        _commit(stream, first)
        assert catalog.store_holders(stream.root) == {
            A: ("host:1", first[0].info.ref),
            B: ("host:1", first[1].info.ref),
        }
        # Worker 2 writes store a's next version: it holds a's copy now; b stays with worker 1.
        second = [_report(stream, A, "host:2"), _report(stream, B, "host:1")]
        _commit(stream, second)
        assert catalog.store_holders(stream.root) == {
            A: ("host:2", second[0].info.ref),
            B: ("host:1", second[1].info.ref),
        }
        # A commit without holders (a replay through the API) leaves them as they were.
        stream.commit()
        assert {s: w for s, (w, _) in catalog.store_holders(stream.root).items()} == {
            A: "host:2",
            B: "host:1",
        }
