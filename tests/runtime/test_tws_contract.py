"""``transform_with_state``'s contract beyond the outputs compared with Spark
(test_tws_vs_spark.py): the change feed of one variable, output modes, the refusals Spark
makes too, ``close()`` per partition and batch, and what a map read costs."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import StatefulQuery, read_state_changes, transform_with_state

from .tws_processors import RowSessionTracker

pytestmark = pytest.mark.spark


def test_the_change_feed_reads_one_variable_or_the_timers(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """``read_state_changes(state_variable=)`` and ``(timers=True)`` read one store of a
    ``transform_with_state`` operator, as ``read_state`` does."""
    op = transform_with_state(
        0, ["part", "user"], "part int, user string", RowSessionTracker(),
        RowSessionTracker.SCHEMA, 1, time_mode="ProcessingTime", pandas=False,
    )  # fmt: skip
    root = str(tmp_path / "ckpt")
    query = StatefulQuery("feed", root, [op], catalog_url=sqlite_catalog_url)
    schema = "part int, user string, amount bigint"
    for batch_id, amounts in enumerate([[1, 2], [3]]):
        df = spark.createDataFrame([(0, "a", a) for a in amounts], schema)
        query.run_batch(df, batch_id, batch_time_ms=1_000 * (batch_id + 1)).release()
    feed = partial(read_state_changes, spark, root, 0, 0, 1, catalog_url=sqlite_catalog_url)

    def changes(**which: object) -> list[tuple[int, str, tuple[object, ...]]]:
        rows = feed(**which).collect()  # type: ignore[arg-type]
        return sorted((r.batch_id, r.change_type, tuple(r.key)) for r in rows)

    # two elements and the list's head, then one element and the head again
    assert changes(state_variable="amounts") == [
        (0, "update", (0, "a", -1)),
        (0, "update", (0, "a", 0)),
        (0, "update", (0, "a", 1)),
        (1, "update", (0, "a", -1)),
        (1, "update", (0, "a", 2)),
    ]
    # the timer set in batch 0 (1 ms after its time) fires and goes in batch 1, which sets one
    assert changes(timers=True) == [
        (0, "update", (0, "a", 1_001)),
        (1, "delete", (0, "a", 1_001)),
        (1, "update", (0, "a", 2_001)),
    ]
    with pytest.raises(InvalidArgument, match="not both"):
        feed(state_variable="amounts", timers=True)
