"""map_groups_with_state with timeouts and TTL, and the runtime on S3 storage."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from state_runtime.catalog import Catalog
from state_runtime.runtime import (
    Agg,
    GroupState,
    StatefulQuery,
    map_groups_with_state,
    read_state,
    running_aggregation,
)

from .reference import assert_lineage_linear, running_totals

pytestmark = pytest.mark.spark
MINUTE = 60_000


def _sessions(
    key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState
) -> list[tuple[Any, ...]]:
    """Count clicks per user session; a session ends after 2 minutes without clicks."""
    if state.has_timed_out:
        clicks = state.get()[0]  # type: ignore[index]
        return [(key[0], clicks, "ended")]
    clicks = (state.get() or (0,))[0] + len(rows)
    state.update((clicks,))
    state.set_timeout_duration(timedelta(minutes=2))
    return [(key[0], clicks, "active")]


def test_map_groups_with_state_times_out_idle_keys(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    op = map_groups_with_state(
        0,
        ["user"],
        "user string",
        "clicks bigint",
        "user string, clicks bigint, status string",
        _sessions,
        2,
    )
    query = StatefulQuery("sessions", str(tmp_path / "ckpt"), [op], catalog_url=sqlite_catalog_url)
    batches = [
        (0, [("ann", 1), ("bob", 1), ("ann", 2)]),
        (1 * MINUTE, [("bob", 3)]),
        (5 * MINUTE // 2, [("cid", 4)]),  # ann's timeout (minute 2) passed, bob's (3) not yet
        (6 * MINUTE, []),  # bob (last at 1) and cid (last at 3) time out
    ]
    outputs = []
    for batch_id, (clock, events) in enumerate(batches):
        df = spark.createDataFrame(events, "user string, page bigint")
        result = query.run_batch(df, batch_id, batch_time_ms=1_700_000_000_000 + clock)
        outputs.append(sorted(tuple(r) for r in result.output.collect()))
        result.release()
    assert outputs == [
        [("ann", 2, "active"), ("bob", 1, "active")],
        [("bob", 2, "active")],
        [("ann", 2, "ended"), ("cid", 1, "active")],
        [("bob", 2, "ended"), ("cid", 1, "ended")],
    ]
    assert read_state(spark, str(tmp_path / "ckpt"), 0, catalog_url=sqlite_catalog_url).count() == 0


def test_ttl_expires_keys_not_updated_in_time(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    def latest(
        key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState
    ) -> list[tuple[Any, ...]]:
        if state.has_timed_out:
            return [(key[0], -1)]  # report the expiry
        state.update((max(r[1] for r in rows),))
        return []

    op = map_groups_with_state(
        0, ["k"], "k string", "v bigint", "k string, v bigint", latest, 2, ttl=timedelta(minutes=5)
    )
    query = StatefulQuery("ttl", str(tmp_path / "ckpt"), [op], catalog_url=sqlite_catalog_url)
    expired = []
    for batch_id, (clock, events) in enumerate(
        [(0, [("a", 1), ("b", 2)]), (4, [("a", 3)]), (7, [])]
    ):
        result = query.run_batch(
            spark.createDataFrame(events, "k string, v bigint"),
            batch_id,
            batch_time_ms=1_700_000_000_000 + clock * MINUTE,
        )
        expired.append(sorted(tuple(r) for r in result.output.collect()))
        result.release()
    assert expired == [[], [], [("b", -1)]]  # a was renewed at minute 4, b expired at minute 5
    rows = read_state(spark, str(tmp_path / "ckpt"), 0, catalog_url=sqlite_catalog_url).collect()
    assert [(r.key.k, r.value.v) for r in rows] == [("a", 3)]


@pytest.mark.s3
def test_runtime_on_s3(spark: SparkSession, s3_storage: Any, sqlite_catalog_url: str) -> None:
    """The same running aggregation with checkpoints on a real S3 endpoint (moto)."""
    op = running_aggregation(
        0, ["user"], "user string", [Agg("n", "count"), Agg("total", "sum", "amount")], 2
    )
    query = StatefulQuery("on_s3", s3_storage, [op], catalog_url=sqlite_catalog_url)
    events = [[(f"u{i % 7}", i) for i in range(b * 10, b * 10 + 30)] for b in range(3)]
    for batch_id, batch in enumerate(events):
        query.run_batch(
            spark.createDataFrame(batch, "user string, amount bigint"), batch_id
        ).release()
    rows = read_state(spark, s3_storage, 0, catalog_url=sqlite_catalog_url).collect()
    expected = running_totals([e for b in events for e in b])
    assert {r.key.user: (r.value.n, r.value.total) for r in rows} == expected
    assert sum(1 for f in s3_storage.list("state") if f.path.endswith(".delta")) == 3 * 2
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 3 * 2
