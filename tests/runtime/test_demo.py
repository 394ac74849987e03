"""``make demo`` run twice in a row, on SQLite and on PostgreSQL: the second run resumes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from demo.clicks import QUERY_ID, parse_args, run
from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet, run_checks
from state_runtime.maintenance.policy import PRESETS
from state_runtime.runtime import read_state

pytestmark = pytest.mark.spark


def _twice(spark: SparkSession, output: Path, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--batches", "2", "--events-per-batch", "300", "--users", "50", "--partitions", "2"]
    argv += ["--output", str(output), "--catalog-url", url]
    first = run(spark, parse_args(argv))
    assert "new run:" in capsys.readouterr().out
    second = run(spark, parse_args(argv))
    out = capsys.readouterr().out
    assert "resuming:" in out and "\ndone: 2 batches" in out
    # The second run continued the first one's batches, on the same stores.
    assert (first, second) == ([0, 1], [2, 3])
    [folder] = (output / "runs").iterdir()
    with Catalog.open(url) as catalog:
        [root] = catalog.roots()
        assert root == (folder / "checkpoint").absolute().as_uri()
        history = catalog.commit_history(root, query_id=QUERY_ID, limit=1)
        assert history[0].batch_id == 3
        assert {r.version for r in catalog.latest_committed(root).values()} == {4}
    # Files gone but the catalog remembers the root: a third run starts a new run folder.
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    folder.rmdir()
    third = run(spark, parse_args(argv))
    assert "new run:" in capsys.readouterr().out and third == [0, 1]
    with Catalog.open(url) as catalog:
        assert len(catalog.roots()) == 2


@pytest.mark.connect
def test_demo_twice_on_sqlite(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _twice(spark, tmp_path / "demo-output", f"sqlite:///{tmp_path / 'catalog.db'}", capsys)


@pytest.mark.postgres
def test_demo_twice_on_postgresql(
    spark: SparkSession, tmp_path: Path, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Catalog.open(pg_schema, upgrade=True).close()  # the owner creates it; the demo runs no DDL
    _twice(spark, tmp_path / "demo-output", pg_schema, capsys)


def test_the_demo_gains_an_aggregate_when_resumed(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's additive change: the demo resumes with ``Agg("max_amount", "max",
    "amount")``; the stream, read_state (newest and as written) and validation agree."""
    output, url = tmp_path / "demo-output", f"sqlite:///{tmp_path / 'catalog.db'}"
    argv = ["--batches", "2", "--events-per-batch", "300", "--users", "40", "--partitions", "2"]
    argv += ["--output", str(output), "--catalog-url", url]
    assert run(spark, parse_args(argv)) == [0, 1]
    assert run(spark, parse_args([*argv, "--max-amount"])) == [2, 3]
    assert "done: 2 batches" in capsys.readouterr().out
    [folder] = (output / "runs").iterdir()
    events = pq.read_table(folder / "events").to_pylist()
    by_file = sorted((folder / "events").iterdir())
    later = [r for f in by_file[2:] for r in pq.read_table(f).to_pylist()]
    assert len(events) == 1200 and len(later) == 600
    with Catalog.open(url) as catalog:
        [root] = catalog.roots()
        report = run_checks(Fleet(catalog, owner="tests"), PRESETS["demo"])
        assert report.ok, report
    state = read_state(spark, root, 0, catalog_url=url)
    assert state.schema["value"].dataType.simpleString() == (
        "struct<clicks:bigint,amount:bigint,max_amount:bigint>"
    )
    expected: dict[str, list[int | None]] = {}
    for r in events:
        clicks, amount, _ = expected.setdefault(r["user"], [0, 0, None])
        expected[r["user"]][:2] = [clicks + 1, amount + r["amount"]]
    for r in later:
        best = expected[r["user"]][2]
        expected[r["user"]][2] = r["amount"] if best is None else max(best, r["amount"])
    assert {r.key.user: list(r.value) for r in state.collect()} == expected
    as_written = read_state(
        spark, root, 0, catalog_url=url, query_id=QUERY_ID, batch_id=1, as_written=True
    )
    assert (
        as_written.schema["value"].dataType.simpleString() == "struct<clicks:bigint,amount:bigint>"
    )
