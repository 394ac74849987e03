"""Schema changes of a running query on a real Spark session: an added aggregate, a declared
rename and widening, and refused changes (before any task runs, nothing written)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from state_runtime.catalog import Catalog
from state_runtime.errors import SchemaMismatch
from state_runtime.runtime import (
    Agg,
    GroupState,
    StatefulQuery,
    map_groups_with_state,
    read_state,
    running_aggregation,
)
from state_runtime.store.schema_evolution import SchemaChange

from .reference import running_totals

pytestmark = pytest.mark.spark

PARTITIONS = 2
Row = tuple[Any, ...]


def _events(seed: int, n: int = 200, users: int = 30) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"user{rng.randrange(users)}", rng.randrange(100)) for _ in range(n)]


def _df(spark: SparkSession, events: list[tuple[str, int]]) -> DataFrame:
    return spark.createDataFrame(events, "user string, amount bigint").repartition(2)


def _query(
    root: str, url: str, aggs: list[Agg], change: SchemaChange | None = None
) -> StatefulQuery:
    op = running_aggregation(0, ["user"], "user string", aggs, PARTITIONS, schema_change=change)
    return StatefulQuery("evolving", root, [op], catalog_url=url)


def _state(spark: SparkSession, root: str, url: str, **kw: Any) -> dict[str, tuple[Any, ...]]:
    return {
        r.key.user: tuple(r.value)
        for r in read_state(spark, root, 0, catalog_url=url, **kw).collect()
    }


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*.*")) if root.exists() else set()


def test_an_added_aggregate_then_a_rename_and_widening_run_end_to_end(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root, url = str(tmp_path / "ckpt"), sqlite_catalog_url
    base = [Agg("n", "count"), Agg("total", "sum", "amount", "int")]
    batches = [_events(b) for b in range(7)]
    query = _query(root, url, base)
    for b in (0, 1):
        query.run_batch(_df(spark, batches[b]), b).release()
    # An added aggregate: old keys read it as null until they are updated.
    query = _query(root, url, [*base, Agg("max_amount", "max", "amount")])
    for b in (2, 3, 4):
        query.run_batch(_df(spark, batches[b]), b).release()
    totals = running_totals([e for b in batches[:5] for e in b])
    maxima: dict[str, int] = {}
    for user, amount in (e for b in batches[2:5] for e in b):
        maxima[user] = max(maxima.get(user, amount), amount)
    expected = {u: (n, t, maxima.get(u)) for u, (n, t) in totals.items()}
    assert _state(spark, root, url) == expected
    before = running_totals([e for b in batches[:2] for e in b])
    assert _state(spark, root, url, query_id="evolving", batch_id=1, as_written=True) == before
    assert _state(spark, root, url, query_id="evolving", batch_id=1) == {
        u: (n, t, None) for u, (n, t) in before.items()
    }
    # A declared rename with a widening of the same field.
    renamed = [
        Agg("n", "count"),
        Agg("amount_sum", "sum", "amount"),
        Agg("max_amount", "max", "amount"),
    ]
    query = _query(root, url, renamed, SchemaChange(renamed={"total": "amount_sum"}))
    for b in (5, 6):
        query.run_batch(_df(spark, batches[b]), b).release()
    totals = running_totals([e for b in batches for e in b])
    for user, amount in (e for b in batches[5:] for e in b):
        maxima[user] = max(maxima.get(user, amount), amount)
    state = read_state(spark, root, 0, catalog_url=url)
    assert state.schema["value"].dataType.simpleString() == (
        "struct<n:bigint,amount_sum:bigint,max_amount:bigint>"
    )
    assert {r.key.user: tuple(r.value) for r in state.collect()} == {
        u: (n, t, maxima.get(u)) for u, (n, t) in totals.items()
    }
    with Catalog.open(url) as catalog:
        history = catalog.schema_history(catalog.roots()[0], 0, "default")
    assert history is not None
    assert [e.from_batch for e in history.entries] == [0, 2, 5]


@pytest.mark.parametrize(
    ("aggs", "change", "rule"),
    [
        (
            [Agg("n", "count"), Agg("sum_amount", "sum", "amount")],
            None,
            "undeclared drop or rename",
        ),
        ([Agg("n", "count", type="int"), Agg("total", "sum", "amount")], None, "not a widening"),
        ([Agg("n", "count")], None, "undeclared drop or rename"),
    ],
)
def test_a_refused_change_fails_before_any_task_and_writes_nothing(
    spark: SparkSession,
    tmp_path: Path,
    sqlite_catalog_url: str,
    aggs: list[Agg],
    change: SchemaChange | None,
    rule: str,
) -> None:
    root, url = str(tmp_path / "ckpt"), sqlite_catalog_url
    query = _query(root, url, [Agg("n", "count"), Agg("total", "sum", "amount")])
    query.run_batch(_df(spark, _events(0)), 0).release()
    files = _files(tmp_path / "ckpt")
    with Catalog.open(url) as catalog:
        [root_uri] = catalog.roots()
        recorded = catalog.schema_history(root_uri, 0, "default")
    refused = _query(root, url, aggs, change)
    with pytest.raises(SchemaMismatch) as err:
        refused.run_batch(_df(spark, _events(1)), 1)
    message = str(err.value)
    assert rule in message and err.value.reason.count("schema change") == 1
    assert "query evolving, operator 0" in message
    assert _files(tmp_path / "ckpt") == files
    with Catalog.open(url) as catalog:
        assert catalog.schema_history(root_uri, 0, "default") == recorded
        assert catalog.commit_history(root_uri, query_id="evolving", limit=5)[0].batch_id == 0


def _count(key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState) -> list[Row]:
    """Counts rows per key (state: ``n``)."""
    n = (state.get() or (0,))[0] + len(rows)
    state.update((n,))
    return [(key[0], n, None)]


def _count_and_best(
    key: tuple[Any, ...], rows: list[tuple[Any, ...]], state: GroupState
) -> list[Row]:
    """Counts rows per key and keeps the largest amount seen (state: ``n, best``; ``best`` is
    None for a key last updated before the field existed)."""
    n, best = state.get() or (0, None)
    amounts = [r[1] for r in rows] + ([] if best is None else [best])
    state.update((n + len(rows), max(amounts)))
    return [(key[0], n + len(rows), max(amounts))]


def test_a_map_groups_with_state_state_gains_a_field(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    root, url = str(tmp_path / "ckpt"), sqlite_catalog_url
    out = "user string, n bigint, best bigint"

    def query(state_schema: str, func: Any) -> StatefulQuery:
        op = map_groups_with_state(0, ["user"], "user string", state_schema, out, func, 2)
        return StatefulQuery("groups", root, [op], catalog_url=url)

    batches = [_events(b, 60, 8) for b in range(4)]
    first = query("n bigint", _count)
    for b in (0, 1):
        first.run_batch(_df(spark, batches[b]), b).release()
    second = query("n bigint, best bigint", _count_and_best)
    for b in (2, 3):
        second.run_batch(_df(spark, batches[b]), b).release()
    counts = {u: n for u, (n, _) in running_totals([e for b in batches for e in b]).items()}
    best: dict[str, int] = {}
    for user, amount in (e for b in batches[2:] for e in b):
        best[user] = max(best.get(user, amount), amount)
    state = _state(spark, root, url)
    assert {u: v[:2] for u, v in state.items()} == {u: (n, best.get(u)) for u, n in counts.items()}
