"""What an operator sees when the demo (a real foreachBatch stream) fails: one paragraph on
stderr, as ``statestore`` prints it, naming the store, the file or setting, the cause and the
next command; never a traceback (that goes to ``<output>/demo.log``). The catalog's failures
are said before Spark starts (a subprocess, no JVM); the stream's through a real session."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from demo.clicks import main
from state_runtime.runtime import read_state

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
    the demo's stream on the driver, inside its foreachBatch function; then the repartition
    the second paragraph prints, run as printed, and the stream on the new count."""
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

    # That command, run as printed in its own process (a dry run, then --execute), moves the
    # state; the demo then runs on 3 stores, each user's count, sum and max as pyarrow's
    command = shlex.split(re.findall(r"`(statestore repartition [^`]*)`", lines[0])[0])
    _quiet_for_two_minutes(tmp_path / "c.db")
    env = {
        **os.environ,
        "STATE_CATALOG_URL": argv[-1],  # the operator's environment names the demo's catalog
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "STATE_LOG_FILE": str(tmp_path / "statestore.log"),
    }
    for extra in ([], ["--execute"]):
        done = subprocess.run(
            [*command, *extra], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert "operator 0 (default) 2 -> 3" in done.stdout, done.stdout
        # The JVM's output (its start-up notes, Spark's log, pyspark's worker daemon's
        # BrokenPipeError at shutdown) goes to the log file: stderr holds progress bars
        # and our warnings only
        assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
        noise = [
            line
            for line in done.stderr.splitlines()
            if line.strip() and "━" not in line and not line.startswith("warning: ")
        ]
        assert noise == [], done.stderr
    capfd.readouterr()
    main([*argv, "--max-amount", "--partitions", "3"], spark)
    assert "across 3 stores" in capfd.readouterr().out
    state = read_state(spark, root, 0, catalog_url=argv[-1]).collect()
    assert sorted((r.key.user, *r.value) for r in state) == _grouped(run / "events")


def _quiet_for_two_minutes(catalog: Path) -> None:
    """Every commit moved two minutes back, as when the operator reads the failure a while
    after the query's last batch (``repartition`` refuses a query that committed less than
    ``--idle``, 60 s, ago: it may be running)."""
    with closing(sqlite3.connect(catalog)) as db, db:
        rows = db.execute("SELECT rowid, committed_at FROM commit_log").fetchall()
        db.executemany(
            "UPDATE commit_log SET committed_at = ? WHERE rowid = ?",
            [(_earlier(at), rowid) for rowid, at in rows],
        )


def _earlier(at: str) -> str:
    moved = datetime.fromisoformat(at) - timedelta(minutes=2)
    return moved.isoformat(sep=" ", timespec="microseconds")


def _grouped(events: Path) -> list[tuple[str, int, int, int]]:
    """Every event in ``events`` grouped by user with pyarrow: (user, clicks, sum, max)."""
    table = pq.read_table(events).group_by("user")
    found = table.aggregate([("amount", "count"), ("amount", "sum"), ("amount", "max")])
    return sorted(
        zip(
            *(found[c].to_pylist() for c in ("user", "amount_count", "amount_sum", "amount_max")),
            strict=True,
        )
    )


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
