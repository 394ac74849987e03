"""How ``statestore`` fails: one line naming what is wrong and what to do, the full trace in
the log file (and on stderr with ``--verbose``); and ``repartition``'s refusals that need only
the catalog and the Spark checkpoint folder come before Spark starts (real files, SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from state_runtime.cli import main
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore, stream  # noqa: F401  (fixture)


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_repartition_refuses_before_spark_starts(
    stream: StoreStream,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unknown query, a batch too recent, a folder that is no Spark checkpoint: each
    refused in one line, and no Spark session was asked for."""
    started: list[str] = []

    def no_spark(*args: object, **kw: object) -> None:
        started.append("spark")
        raise AssertionError("Spark started")

    monkeypatch.setattr("state_runtime.runtime.spark_session.spark_session", no_spark)
    not_spark = str(tmp_path / "not-spark")
    (tmp_path / "not-spark").mkdir()
    base = ["repartition", stream.root, "--partitions", "7"]
    for args, code, expected in (
        (["--query", "nope", "--no-spark-checkpoint"], 2, "no query 'nope' committed below"),
        (["--query", stream.query, "--no-spark-checkpoint"], 3, "it looks running"),
        (
            ["--query", stream.query, "--idle", "0s", "--spark-checkpoint", not_spark],
            2,
            "is not a Spark checkpoint: it has no offsets/ folder",
        ),
    ):  # fmt: skip
        result = statestore(stream, *base, *args)
        assert result.exit_code == code, result.output
        assert expected in result.output and len(result.output.splitlines()) == 1, result.output
    assert started == []


def test_catalog_down_is_one_line_and_the_trace_goes_to_the_log(tmp_path: Path) -> None:
    """PostgreSQL down (nothing listens on the port): one line with the next step (after one
    warning of its first retry, without -q); the trace is in $STATE_LOG_FILE, and on stderr
    too with --verbose."""
    log = tmp_path / "state.log"
    runner = CliRunner(env={"STATE_LOG_FILE": str(log), "STATE_CATALOG_URL": None})
    down = ["--catalog-url", "postgresql+psycopg2://postgres@127.0.0.1:9/state", "-q"]
    quiet = runner.invoke(main, [*down, "validate"])
    assert quiet.exit_code == 4
    [line] = quiet.output.splitlines()
    assert line.startswith("error: [STATE_CATALOG_UNAVAILABLE] cannot connect to the catalog")
    assert "`pg_isready -h 127.0.0.1 -p 9`" in line
    assert "Traceback (most recent call last)" in log.read_text()
    # without -q, the first retry's warning, then the error: the cause is not said 5 times
    shown = runner.invoke(main, [*down[:-1], "validate"])
    assert shown.exit_code == 4
    first, last = shown.output.splitlines()
    assert first.startswith("warning: catalog schema check: transient error (attempt 1 of ")
    assert last == line
    verbose = runner.invoke(main, [*down, "--verbose", "validate"])
    assert verbose.exit_code == 4
    assert "Traceback (most recent call last)" in verbose.output
    assert verbose.output.splitlines()[-1] == line
