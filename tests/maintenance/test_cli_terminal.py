"""The operator's terminal, end to end through ``statestore`` (issue 38): ``explain`` takes a
path however it is typed and never guesses; ``repartition`` refuses what the catalog and the
folder alone refuse before any JVM starts; ``health`` is one line per store below 120 columns;
``metrics`` scopes like the other commands; a "since" is the moment the status changed, and a
restore is not a validation. Real files, moto's S3, SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from state_runtime.catalog import Catalog
from state_runtime.cli import main
from state_runtime.identity import StoreId
from tests.maintenance.streams import StoreStream
from tests.s3_fixtures import CREDENTIALS, REGION, MotoS3

ONE = [StoreId(0, 0)]
STATESTORE = Path(sys.executable).parent / "statestore"


def statestore(catalog: Catalog, *args: str, columns: int = 250) -> Result:
    url = catalog.engine.url.render_as_string(hide_password=False)
    runner = CliRunner(env={"COLUMNS": str(columns), "STATE_CATALOG_URL": None})
    return runner.invoke(main, ["--catalog-url", url, "-q", *args])


def one_error(result: Result, code: int) -> str:
    """The one ``error: [STATE_...]`` line a refusal prints, with its exit code."""
    assert result.exit_code == code, result.output
    [line] = result.output.splitlines()
    assert line.startswith("error: [STATE_INVALID_ARGUMENT] "), line
    return line


def test_explain_takes_every_spelling_of_a_path_and_refuses_the_rest(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same delta typed relative to the current folder (through ``..`` and a symlinked
    folder too), relative to its root, absolute and as a URI with ``..``: each names it.
    A path that climbs out of every root, however typed, is below none (the roots named); a
    name both roots hold is ambiguous (both named); a needed delta that is gone is missing,
    never "untracked"."""
    first = make_stream("a/checkpoint", stores=ONE)
    second = make_stream("b/checkpoint", stores=ONE)
    first.run(4)
    second.run(4)
    delta = first.committed[ONE[0]][-1].path
    (tmp_path / "link").symlink_to(tmp_path / "a")
    monkeypatch.chdir(tmp_path / "a")
    spellings = [
        f"checkpoint/{delta}",
        f"./checkpoint/state/../{delta}",
        f"../a/checkpoint/{delta}",
        f"../link/checkpoint/{delta}",
        delta,
        str(tmp_path / "a" / "checkpoint" / delta),
        f"{first.root}/state/0/../0/{delta.removeprefix('state/0/')}",
    ]
    for typed in spellings:
        named = statestore(first.catalog, "explain", typed)
        assert named.exit_code == 0, (typed, named.output)
        lines = named.output.splitlines()
        assert lines[:2] == [f"{first.root}/{delta}", "verdict: needed"], (typed, lines)

    roots = f"{first.root}, {second.root}"
    for typed in ("checkpoint/../../../etc/passwd", "state/../../x.delta", "/etc/passwd"):
        line = one_error(statestore(first.catalog, "explain", typed), 2)
        assert line.endswith(f"{typed!r} is below none of the catalog's roots: {roots}"), line
    climbing = f"{first.root}/../../b/checkpoint/{delta}"  # a URI is resolved, then compared
    assert f"{second.root}/{delta}" not in statestore(first.catalog, "explain", climbing).output
    scoped = statestore(first.catalog, "--root", second.root, "explain", f"checkpoint/{delta}")
    line = one_error(scoped, 2)  # read below the root in scope only, never the other
    assert line.endswith(f"storage holds (checkpoint/{delta} below {second.root})"), line

    for stream in (first, second):
        (stream.storage.root / "notes.txt").write_text("a file both roots hold")
    line = one_error(statestore(first.catalog, "explain", "notes.txt"), 2)
    assert f"'notes.txt' is ambiguous: it names notes.txt below {first.root}; notes.txt " in line
    assert f"below {second.root}; give its URI or absolute path" in line

    (first.storage.root / delta).unlink()
    gone = statestore(first.catalog, "explain", f"checkpoint/{delta}")
    assert gone.exit_code == 0, gone.output
    assert "verdict: missing" in gone.output and "untracked" not in gone.output
    assert "orphan" not in gone.output


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_explain_on_an_s3_root(
    catalog: Catalog, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 root: the file as ``s3://``, as ``s3a://`` (as Hadoop writes it), and relative to
    the root; a key that climbs out of the root's prefix is below none."""
    for name, value in {
        "STATE_S3_ENDPOINT_URL": moto_s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    stream = StoreStream(catalog, moto_s3.storage(), ONE)
    stream.run(3)
    delta = stream.committed[ONE[0]][-1].path
    bucket = stream.root.removeprefix("s3://").split("/")[0]
    for typed in (f"{stream.root}/{delta}", f"s3a://{bucket}/checkpoint/{delta}", delta):
        named = statestore(catalog, "explain", typed)
        assert named.exit_code == 0, (typed, named.output)
        assert named.output.splitlines()[:2] == [f"{stream.root}/{delta}", "verdict: needed"]
    climbing = f"s3://{bucket}/checkpoint/../elsewhere/{delta}"
    line = one_error(statestore(catalog, "explain", climbing), 2)
    assert line.endswith(f"is below none of the catalog's roots: {stream.root}"), line


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_repartition_refuses_before_any_jvm_starts(
    make_stream: Callable[..., StoreStream], tmp_path: Path
) -> None:
    """An unknown query, a batch too recent, a folder that is no Spark checkpoint: each is
    refused in one line by the real command, and no JVM was started (``$JAVA_HOME/bin/java``
    leaves a mark if anything runs it), about as fast as a ``health`` that starts nothing."""
    stream = make_stream(stores=ONE)
    stream.run(2)
    java = tmp_path / "java-home" / "bin" / "java"
    java.parent.mkdir(parents=True)
    mark = tmp_path / "jvm-started"
    java.write_text(f"#!/bin/sh\ntouch '{mark}'\nexit 1\n")
    java.chmod(0o755)
    (tmp_path / "not-spark").mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "100"}
    env |= {"JAVA_HOME": str(java.parent.parent)}
    env |= {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}  # a worktree's code
    url = stream.catalog.engine.url.render_as_string(hide_password=False)

    def run(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [str(STATESTORE), "-q", "--catalog-url", url, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        return done, time.monotonic() - started

    _, baseline = run("health")
    base = ["repartition", stream.root, "--partitions", "7"]
    for args, code, expected in (
        (["--query", "nope", "--no-spark-checkpoint"], 2,
         f"[STATE_INVALID_ARGUMENT] no query 'nope' committed below {stream.root} (known: "
         "query-1)"),
        (["--query", stream.query, "--no-spark-checkpoint"], 3,
         f"[STATE_MAINTENANCE_REFUSED] query {stream.query} committed batch 1 "),
        (["--query", stream.query, "--idle", "0s", "--spark-checkpoint",
          str(tmp_path / "not-spark")], 2,
         f"{tmp_path / 'not-spark'} is not a Spark checkpoint: it has no offsets/ folder"),
    ):  # fmt: skip
        refused, took = run(*base, *args)
        assert refused.returncode == code, refused.stderr
        assert refused.stdout == "" and not mark.exists(), refused.stderr
        [line] = refused.stderr.splitlines()  # one paragraph, no trace, no JVM noise
        assert expected in line, line
        assert took < 2 * baseline + 10, (took, baseline)


def test_health_is_one_line_per_store_below_120_columns(
    make_stream: Callable[..., StoreStream],
) -> None:
    """``COLUMNS`` below 120: the root once, then one line per store (store, status, since,
    why); 120 and wider: the table of figures. ``--table`` and ``--brief`` choose either."""
    stream = make_stream()
    stream.run(2)
    brief = statestore(stream.catalog, "health", columns=119)
    assert brief.exit_code == 3, brief.output  # never validated: unknown
    lines = brief.output.splitlines()
    assert lines[0] == f"root: {stream.root}" and len(lines) == 1 + len(stream.stores)
    for line, store in zip(lines[1:], ("0/0/default", "0/1/default", "1/0/sessions"), strict=True):
        assert line.split()[:3] == [store, "unknown", "since"], line
        assert line.endswith("  never validated") and len(line) <= 119, line
    table = statestore(stream.catalog, "health", columns=120)
    assert "health: 3 store(s): 3 unknown" in table.output and len(table.output.splitlines()) > 4
    assert statestore(stream.catalog, "health", "--brief", columns=200).output == brief.output
    forced = statestore(stream.catalog, "health", "--table", columns=80)
    assert "health: 3 store(s): 3 unknown" in forced.output


def test_metrics_scopes_like_the_other_commands(make_stream: Callable[..., StoreStream]) -> None:
    """Two roots, one query each: ``metrics`` alone is refused naming both queries and their
    roots; ``--query`` alone finds its root; ``--root`` alone its one query."""
    first = make_stream("a/checkpoint", stores=ONE)
    second = make_stream("b/checkpoint", stores=ONE, query="query-2")
    first.run(1)
    second.run(1)
    catalog = first.catalog
    several = statestore(catalog, "metrics")
    assert several.exit_code == 2
    assert several.output.splitlines() == [
        f"error: 2 queries in scope (query-1 below {first.root}, query-2 below {second.root}): "
        "name one with --query"
    ]
    by_query = statestore(catalog, "metrics", "--query", "query-2")
    assert by_query.exit_code == 0, by_query.output
    assert "Batch metrics of query query-2 (0 batches" in by_query.output
    by_root = statestore(catalog, "--root", first.root, "metrics")
    assert "Batch metrics of query query-1 (0 batches" in by_root.output
    unknown = statestore(catalog, "--root", first.root, "metrics", "--query", "query-2")
    assert unknown.exit_code == 2
    assert unknown.output.splitlines() == [
        f"error: --query 'query-2': no such query; the queries in scope: query-1 below {first.root}"
    ]


def test_airflow_page_reserializes_before_listing() -> None:
    """Airflow 3 lists only the DAGs its database holds: the page runs ``airflow dags
    reserialize`` before ``airflow dags list``."""
    page = (Path(__file__).parents[2] / "docs" / "airflow.md").read_text()
    reserialize = page.index("airflow dags reserialize")
    assert reserialize < page.index("airflow dags list")


def test_since_is_when_the_status_changed_and_a_restore_is_not_a_validation(
    make_stream: Callable[..., StoreStream],
) -> None:
    """Through the commands an operator runs: validated (healthy), a delta lost and found
    (broken since the finding), restored (unknown since the restore, the last validation still
    the one before it), validated again (healthy since that validation). ``health --brief``
    and ``--json`` agree, and the reason names the lost file once."""
    stream = make_stream(stores=ONE)
    stream.run(5)
    catalog = stream.catalog

    def status() -> dict[str, object]:
        [store] = json.loads(statestore(catalog, "health", "--json").output)
        return dict(store)

    def brief() -> str:
        """The store's line (a reason longer than the width wraps below it)."""
        return statestore(catalog, "health", "--brief").output.splitlines()[1]

    def moment(value: object) -> datetime:
        return datetime.fromisoformat(str(value))

    assert statestore(catalog, "validate").exit_code == 0
    healthy = status()
    assert healthy["status"] == "healthy"
    lost = stream.committed[ONE[0]][-1].path
    (stream.storage.root / lost).unlink()
    assert statestore(catalog, "validate").exit_code == 1
    broken = status()
    assert broken["status"] == "broken" and broken["status_since"] == broken["problems_since"]
    assert str(broken["status_reason"]).count(lost) == 1, broken["status_reason"]
    found = moment(broken["status_since"])
    assert brief().startswith(f"0/0/default  broken  since {found:%Y-%m-%d %H:%M}  delta {lost}")

    restored = statestore(
        catalog, "restore", stream.root, "--query", stream.query, "--to-batch", "3",
        "--no-spark-checkpoint", "--execute",
    )  # fmt: skip
    assert restored.exit_code == 0, restored.output
    unknown = status()
    assert unknown["status"] == "unknown"
    assert unknown["status_reason"] == "restored; not validated since"
    assert unknown["last_validated_at"] == broken["last_validated_at"]  # not the restore
    assert moment(unknown["status_since"]) > moment(broken["last_validated_at"])
    since = moment(unknown["status_since"])
    reason = "restored; not validated since"
    assert brief() == f"0/0/default  unknown  since {since:%Y-%m-%d %H:%M}  {reason}"

    assert statestore(catalog, "validate").exit_code == 0
    again = status()
    assert again["status"] == "healthy" and again["status_recorded"] is True
    validated = moment(again["last_validated_at"])
    assert since < validated <= moment(again["status_since"])
