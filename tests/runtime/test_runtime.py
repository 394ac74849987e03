"""The runtime on a real Spark session (the test marked ``executors``: two executor JVMs, on
local-cluster, so that partitions really move between executors)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.tables import store_holders
from state_runtime.errors import InvalidArgument
from state_runtime.runtime import (
    Agg,
    StatefulOperator,
    StatefulQuery,
    read_state,
    read_state_metadata,
    running_aggregation,
)
from state_runtime.store.state_store import StateStore

from .reference import assert_lineage_linear, running_totals

pytestmark = [pytest.mark.spark, pytest.mark.connect]

PARTITIONS = 3


def _events(seed: int, n: int, users: int = 40) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(users)}", rng.randrange(100)) for _ in range(n)]


def _df(spark: SparkSession, events: list[tuple[str, int]]) -> DataFrame:
    return spark.createDataFrame(events, "user string, amount bigint").repartition(2)


def _totals_op() -> StatefulOperator:
    return running_aggregation(
        0,
        ["user"],
        "user string",
        [Agg("n", "count"), Agg("total", "sum", "amount")],
        PARTITIONS,
    )


def _state(spark: SparkSession, root: str, url: str, **kw: Any) -> dict[str, tuple[int, int]]:
    rows = read_state(spark, root, 0, catalog_url=url, **kw).collect()
    return {r.key.user: (r.value.n, r.value.total) for r in rows}


@pytest.mark.executors
def test_running_aggregation_matches_the_reference(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    query = StatefulQuery("totals", root, [_totals_op()], catalog_url=sqlite_catalog_url)
    seen: list[tuple[str, int]] = []
    workers: set[str] = set()
    for batch in range(4):
        events = _events(batch, 300)
        seen.extend(events)
        result = query.run_batch(_df(spark, events), batch)
        output = {r.user: (r.n, r.total) for r in result.output.collect()}
        expected = running_totals(seen)
        # Update mode: the batch outputs exactly the keys it touched, with their new totals.
        assert output == {u: expected[u] for u in {e[0] for e in events}}
        assert result.metrics.rows_in == 300 and result.metrics.state_rows == len(expected)
        workers.update(r.worker for r in result.reports)
        result.release()
    assert _state(spark, root, sqlite_catalog_url) == running_totals(seen)
    assert _state(spark, root, sqlite_catalog_url, query_id="totals", batch_id=1) == running_totals(
        [e for b in range(2) for e in _events(b, 300)]
    )
    assert _state(spark, root, sqlite_catalog_url, version=1) == running_totals(_events(0, 300))
    # Two executors, each with its own Python workers: partitions really moved around.
    assert len(workers) >= 2
    with Catalog.open(sqlite_catalog_url) as catalog:
        assert assert_lineage_linear(catalog, query.storage) == 4 * PARTITIONS
        metrics = catalog.batch_metrics(query.root, "totals")
        assert sorted(m.batch_id for m in metrics) == [0, 1, 2, 3]
        # The coordinator knows a holder for every store: the worker of its last commit.
        with catalog.engine.connect() as connection:
            holders = connection.execute(sa.select(store_holders)).all()
        assert len(holders) == PARTITIONS and {h.version for h in holders} == {4}
        assert {h.worker for h in holders} <= workers
    meta = read_state_metadata(spark, root, catalog_url=sqlite_catalog_url).collect()
    assert sorted((m.partition_id, m.version) for m in meta) == [(p, 4) for p in range(PARTITIONS)]


def test_the_stateful_stage_runs_once_per_batch(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Handing the output to a sink (several actions) does not run the stage again: no new
    checkpoint files appear after the batch committed."""
    root = tmp_path / "ckpt"
    query = StatefulQuery("once", str(root), [_totals_op()], catalog_url=sqlite_catalog_url)
    result = query.run_batch(_df(spark, _events(1, 200)), 0)
    files_after_commit = sorted(p.name for p in root.rglob("*.delta"))
    assert len(files_after_commit) == PARTITIONS
    result.output.count()
    result.output.collect()
    result.output.groupBy().sum("total").collect()
    assert sorted(p.name for p in root.rglob("*.delta")) == files_after_commit
    result.release()


def test_changing_the_number_of_partitions_is_refused(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root = str(tmp_path / "ckpt")
    StatefulQuery("q", root, [_totals_op()], catalog_url=sqlite_catalog_url).run_batch(
        _df(spark, _events(2, 50)), 0
    ).release()
    wider = running_aggregation(0, ["user"], "user string", [Agg("n", "count")], PARTITIONS + 1)
    with pytest.raises(InvalidArgument, match=f"cannot run with {PARTITIONS + 1}"):
        StatefulQuery("q", root, [wider], catalog_url=sqlite_catalog_url).run_batch(
            _df(spark, _events(3, 50)), 1
        )


class _Dedup:
    """A custom update function: a user passes once, with the least amount of the first batch
    it appears in (rows within a batch arrive in no particular order)."""

    def __call__(self, store: StateStore, rows: pa.Table) -> list[tuple[Any, ...]]:
        least: dict[str, int] = {}
        users, amounts = rows.column("user").to_pylist(), rows.column("amount").to_pylist()
        for user, amount in zip(users, amounts, strict=True):
            least[user] = min(amount, least.get(user, amount))
        out = []
        for user, amount in least.items():
            if store.get(user) is None:
                store.put(user, (amount,))
                out.append((user, amount))
        return out


def test_custom_operator_and_chained_operators(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """Two operators in one query: dedup (first amount per user) feeds a running sum; both
    commit in one catalog transaction per batch."""
    dedup = StatefulOperator(
        operator_id=0,
        key_columns=["user"],
        key_schema="user string",
        value_schema="first bigint",
        output_schema="user string, amount bigint",
        update=_Dedup(),
        num_partitions=2,
    )
    total = running_aggregation(1, ["user"], "user string", [Agg("total", "sum", "amount")], 2)
    query = StatefulQuery(
        "chain", str(tmp_path / "ckpt"), [dedup, total], catalog_url=sqlite_catalog_url
    )
    first: dict[str, int] = {}
    for batch in range(2):
        events = [(u, batch * 1000 + a) for u, a in _events(10 + batch, 100, users=20)]
        in_batch: dict[str, int] = {}
        for u, a in events:
            in_batch[u] = min(a, in_batch.get(u, a))
        for u, a in in_batch.items():
            first.setdefault(u, a)
        query.run_batch(
            spark.createDataFrame(events, "user string, amount bigint"), batch
        ).release()
    rows = read_state(spark, str(tmp_path / "ckpt"), 1, catalog_url=sqlite_catalog_url).collect()
    # Each user passed dedup exactly once, so the running sum is its first amount.
    assert {r.key.user: r.value.total for r in rows} == first
    with Catalog.open(sqlite_catalog_url) as catalog:
        commits = catalog.commit_history(query.root, query_id="chain", limit=1000)
        assert sorted({(c.batch_id, c.key.store.operator_id) for c in commits}) == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]
