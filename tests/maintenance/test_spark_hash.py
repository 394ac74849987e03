"""The Python routing (state_runtime/maintenance/spark_hash.py) against Spark's own: the
partition ``spark_partition_id()`` reports after ``repartition(n, key columns)``, for ints,
longs, strings (non-ASCII and of every length modulo 4), nulls and composite keys, and the
value of ``hash(...)`` itself."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from state_runtime.errors import InvalidArgument
from state_runtime.maintenance.spark_hash import spark_hash, spark_partition

STRINGS = [
    "",
    "a",
    "ab",
    "abc",
    "abcd",
    "abcde",
    "é",
    "naïve café",
    "日本語のキー",
    "🙂 emoji",
    "ÿÿÿ",
    None,
    "check points+%#é",
]
INTS = [0, 1, -1, 7, 2**31 - 1, -(2**31), None, 123456]
LONGS = [0, 1, -1, 2**40 + 3, 2**63 - 1, -(2**63), None, -987654321012]
SCHEMA = "s string, i int, l long, b boolean, d double, day date"
ROWS = [
    (
        STRINGS[n % len(STRINGS)],
        INTS[n % len(INTS)],
        LONGS[n % len(LONGS)],
        None if n % 5 == 0 else n % 2 == 0,
        [0.0, -0.0, 1.5, float("nan"), None, -2.25][n % 6],
        None if n % 7 == 0 else dt.date(2020, 1, 1) + dt.timedelta(days=n * 37),
    )
    for n in range(120)
]
KEYS = [["s"], ["i"], ["l"], ["b"], ["d"], ["day"], ["s", "i"], ["i", "l", "s"], ["day", "d"]]


@pytest.fixture(scope="module")
def expected(spark: SparkSession) -> tuple[pa.Table, dict[tuple[str, ...], list[tuple]]]:
    """The rows as Arrow, and per key and partition count what Spark says of each row: its
    ``hash`` and the partition ``repartition(n, key)`` put it in."""
    frame = spark.createDataFrame(ROWS, SCHEMA).withColumn("row", F.monotonically_increasing_id())
    found: dict[tuple[str, ...], list[tuple]] = {}
    for key in KEYS:
        for n in (1, 2, 3, 7, 200):
            routed = (
                frame.repartition(n, *key)
                .select("row", F.spark_partition_id().alias("p"), F.hash(*key).alias("h"))
                .collect()
            )
            # in row order, sorted here: Spark's sort would add two jobs per case
            found[(*key, str(n))] = [
                (r["p"], r["h"]) for r in sorted(routed, key=lambda r: r["row"])
            ]
    arrow = frame.orderBy("row").toArrow() if hasattr(frame, "toArrow") else None
    assert arrow is not None
    return arrow, found


@pytest.mark.parametrize("key", KEYS, ids=lambda k: "+".join(k))
def test_the_python_routing_is_spark_s(
    expected: tuple[pa.Table, dict[tuple[str, ...], list[tuple]]], key: list[str]
) -> None:
    table, found = expected
    columns = [table.column(c) for c in key]
    for n in (1, 2, 3, 7, 200):
        spark_says = found[(*key, str(n))]
        assert spark_hash(columns).tolist() == [h for _, h in spark_says], (key, n)
        assert spark_partition(columns, n).tolist() == [p for p, _ in spark_says], (key, n)


def test_a_type_without_a_python_routing_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="decimal"):
        spark_partition([pa.array([1], type=pa.decimal128(10, 2))], 2)
