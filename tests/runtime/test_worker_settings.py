"""Worker settings are read on the driver when a batch starts and shipped to its tasks; catalog
timeouts are read on the driver when the catalog is opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import Agg, StatefulQuery, running_aggregation

pytestmark = pytest.mark.spark


def test_a_bad_worker_setting_fails_the_batch_on_the_driver_before_any_task(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    op = running_aggregation(0, ["user"], "user string", [Agg("n", "count")], 2)
    query = StatefulQuery("settings", str(root), [op], catalog_url=sqlite_catalog_url)
    df = spark.createDataFrame([("a",), ("b",)], "user string")
    monkeypatch.setenv("STATE_CACHE_BYTES", "lots")  # read now, not when the library loaded
    with pytest.raises(InvalidArgument, match="STATE_CACHE_BYTES='lots'"):
        query.run_batch(df, 0)
    assert not list(root.rglob("*.delta"))  # no task ran
    monkeypatch.setenv("STATE_CACHE_BYTES", "1GiB")
    query.run_batch(df, 0).release()
    assert len(list(root.rglob("*.delta"))) == 2
    # Tasks never open the catalog: its timeouts are read where it is opened, on the driver,
    # when the query is made (and again when a foreach_batch copy reopens it).
    monkeypatch.setenv("STATE_CATALOG_ATTEMPT_TIMEOUT", "1s")  # below statement and lock
    with pytest.raises(InvalidArgument, match="STATE_CATALOG_ATTEMPT_TIMEOUT"):
        StatefulQuery("settings", str(root), [op], catalog_url=sqlite_catalog_url)
    assert len(list(root.rglob("*.delta"))) == 2


def test_settle_freezes_the_worker_once() -> None:
    """PySpark's daemon runs a full gc.collect() after every task; settle() moves what a
    worker holds after its first task out of the collector's sight, once."""
    import gc

    from state_runtime.runtime import worker

    worker._settled = False
    try:
        before = gc.get_freeze_count()
        worker.settle()
        frozen = gc.get_freeze_count()
        assert frozen > before
        garbage = [[] for _ in range(1000)]
        worker.settle()  # a second call freezes nothing new (frozen objects may still be freed)
        assert gc.get_freeze_count() < frozen + len(garbage)
        del garbage
    finally:
        gc.unfreeze()
        worker._settled = False
