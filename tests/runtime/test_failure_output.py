"""What an operator sees when the demo (a real foreachBatch stream) fails: one paragraph on
stderr, as ``statestore`` prints it, naming the store, the file or setting, the cause and the
next command; never a traceback (that goes to ``<output>/demo.log``). The catalog's failures
are said before Spark starts (a subprocess, no JVM); the stream's through a real session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from demo.clicks import main

pytestmark = pytest.mark.spark

ARGV = ["--batches", "2", "--events-per-batch", "200", "--users", "30", "--partitions", "2"]


def _paragraph(err: str) -> list[str]:
    """The failure's lines, checked: at most 8, one ``error:`` paragraph, no trace."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 8, err
    assert "Traceback" not in err and "py4j" not in err.lower() and "JVM" not in err, err
    assert lines[0].startswith("error: [STATE_"), err
    return lines


def _demo(argv: list[str], capfd: pytest.CaptureFixture[str], spark: SparkSession) -> str:
    """The demo run in this process on the tests' session; its stderr after a failure."""
    with pytest.raises(SystemExit) as ended:
        main(argv, spark)
    assert ended.value.code == 1
    return capfd.readouterr().err


def test_the_catalog_said_before_spark_starts(tmp_path: Path) -> None:
    """PostgreSQL down (nothing listens on the port) and a bad URL: the paragraph and its
    next step, within seconds (no JVM starts: nothing of Spark in the output)."""
    closed = "postgresql+psycopg2://postgres@127.0.0.1:9/state"
    down = ["[STATE_CATALOG_UNAVAILABLE]", "Connection refused", "pg_isready -h 127.0.0.1 -p 9"]
    bad = ["[STATE_CATALOG_URL_INVALID]", "postgresql+psycopg2://"]
    for url, expected in ((closed, down), ("mysql://somewhere/db", bad)):
        done = _subprocess_demo([*ARGV, "--output", str(tmp_path), "--catalog-url", url])
        assert done.returncode == 1, done.stderr
        lines = _paragraph(done.stderr)
        assert all(e in lines[0] for e in expected), lines
        assert lines[-1] == f"full trace: {tmp_path.absolute() / 'demo.log'}"
        assert "Traceback" in (tmp_path / "demo.log").read_text()
        assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_stream_failures_are_one_paragraph(
    spark: SparkSession, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A refused schema change and a partition count other than the catalog's, each failing
    the demo's stream on the driver, inside its foreachBatch function."""
    out = tmp_path / "out"
    argv = [*ARGV, "--output", str(out), "--catalog-url", f"sqlite:///{tmp_path / 'c.db'}"]
    main([*argv, "--max-amount"], spark)
    capfd.readouterr()
    [run] = (out / "runs").iterdir()
    root = (run / "checkpoint").absolute().as_uri()

    # An undeclared drop of a field (the code rolled back): refused on the driver
    lines = _paragraph(_demo(argv, capfd, spark))
    assert "[STATE_SCHEMA_MISMATCH]" in lines[0] and "max_amount" in lines[0], lines

    # Another partition count: refused, naming the command that changes it
    lines = _paragraph(_demo([*argv, "--max-amount", "--partitions", "3"], capfd, spark))
    assert "[STATE_INVALID_ARGUMENT]" in lines[0] and "has 2 state partitions" in lines[0]
    assert f"statestore repartition {root} --query clicks_per_user" in lines[0], lines
    spark_checkpoint = (run / "spark-checkpoint").absolute()
    assert f"--partitions 3 --spark-checkpoint {spark_checkpoint}`" in lines[0], lines


def _subprocess_demo(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "demo", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        timeout=600,
    )


def test_a_quiet_demo_then_a_damaged_file(tmp_path: Path) -> None:
    """``make demo`` as run: its own JVM prints nothing (no log4j lines, no pandas warning, no
    traceback); after a delta is truncated, the next run (a cold load in a new JVM) ends in
    the paragraph naming the store and the file."""
    argv = [*ARGV, "--output", str(tmp_path), "--catalog-url", f"sqlite:///{tmp_path / 'c.db'}"]
    first = _subprocess_demo(argv)
    assert first.returncode == 0, first.stderr
    assert first.stderr == "", first.stderr
    assert "done: 2 batches" in first.stdout and "Traceback" not in first.stdout
    [run] = (tmp_path / "runs").iterdir()
    [delta] = sorted((run / "checkpoint" / "state" / "0" / "1" / "default").glob("2_*.delta"))
    data = delta.read_bytes()
    delta.write_bytes(data[: len(data) // 2])
    second = _subprocess_demo(argv)
    assert second.returncode == 1
    lines = _paragraph(second.stderr)
    assert "0/1/default" in lines[0] and delta.name in lines[0], lines
    assert lines[-1] == f"full trace: {tmp_path.absolute() / 'demo.log'}"
    assert "Traceback" not in second.stdout
    assert "Traceback" in (tmp_path / "demo.log").read_text()
