"""Per-batch metrics: the view ``state_batch_metrics`` on SQLite and PostgreSQL and
``statestore metrics`` (table and ``--json``) show what the runtime recorded."""

from __future__ import annotations

import json
from collections.abc import Callable

import sqlalchemy as sa

from state_runtime.catalog import BatchMetrics
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore


def test_batch_metrics_view_and_command(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(3)
    for batch in range(3):
        stream.catalog.record_batch_metrics(
            stream.root,
            stream.query,
            batch,
            BatchMetrics(
                rows_in=100 + batch,
                keys_updated=10 * batch,
                state_rows=50,
                bytes_written=4096,
                commit_ms=3.5,
                cache_hits=2,
                cache_misses=1,
                extra={"batch_ms": 250.0 + batch, "cache_hit_rate": 2 / 3, "late_rows": batch},
                resident_bytes=3_000_000,
                local_disk_bytes=(5 + batch) * 10**9,
                block_cache_hits=90,
                block_cache_misses=10,
                compaction_bytes=batch * 10**6,
            ),
        )
    with stream.catalog.engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT batch_id, rows_in, keys_updated, batch_ms, cache_hit_rate, late_rows,"
                " max_load_ms, local_disk_bytes, compaction_bytes FROM state_batch_metrics"
                " WHERE query_id = :q ORDER BY batch_id"
            ),
            {"q": stream.query},
        ).all()
    assert [(r.batch_id, r.rows_in, r.keys_updated) for r in rows] == [
        (0, 100, 0),
        (1, 101, 10),
        (2, 102, 20),
    ]
    assert [float(r.batch_ms) for r in rows] == [250.0, 251.0, 252.0]
    assert abs(float(rows[0].cache_hit_rate) - 2 / 3) < 1e-9
    assert [int(r.late_rows) for r in rows] == [0, 1, 2] and rows[0].max_load_ms is None
    assert [(r.local_disk_bytes // 10**9, r.compaction_bytes // 10**6) for r in rows] == [
        (5, 0),
        (6, 1),
        (7, 2),
    ]

    table = statestore(stream, "metrics", stream.root, "--query", stream.query, "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "Batch metrics of query query-1 (2 batches" in table.output
    assert "252 ms" in table.output and "2/3" in table.output and "250 ms" not in table.output
    assert "7.0 GB" in table.output and "3.0 MB" in table.output
    data = json.loads(
        statestore(stream, "metrics", stream.root, "--query", stream.query, "--json").output
    )
    assert [d["batch_id"] for d in data] == [2, 1, 0]
    assert data[0]["batch_ms"] == 252.0 and data[0]["rows_in"] == 102
    assert data[0]["local_disk_bytes"] == 7 * 10**9 and data[0]["block_cache_hits"] == 90
    unknown = statestore(stream, "metrics", stream.root, "--query", "nope")
    assert unknown.exit_code == 2, unknown.output
    assert f"no such query; the queries in scope: query-1 below {stream.root}" in unknown.output
    # Scoped like the other commands: --root, or the catalog's one root; its one query
    for scope in (["--root", stream.root, "metrics"], ["metrics"]):
        implied = statestore(stream, *scope, "--limit", "2")
        assert implied.exit_code == 0, implied.output
        assert implied.output == table.output
