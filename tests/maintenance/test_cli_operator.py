"""The operator's CLI: history, complete ``--json`` on every command, whole values on pipes,
``--version``, defaults in help, store names as ``health`` prints them (SQLite and
PostgreSQL, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from state_runtime.cli import main
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore


@pytest.fixture
def maintained(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Three stores: 12 versions, a snapshot pass, 3 more versions, and a second pass under
    the demo policy (no window): deltas 1..12 are deleted, snapshots 12 and 15 stay."""
    stream = make_stream()
    stream.run(12)
    assert statestore(stream, "--policy", "demo", "maintain", "--execute").exit_code == 0
    stream.run(3)
    done = statestore(stream, "--policy", "demo", "maintain", "--execute", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["policy"]["window"] == "0s" and report["dry_run"] is False
    assert report["snapshots"]["counts"]["written"] == 3
    assert len(report["cleanup"]["deleted"]) == 3 * 12
    return stream


def test_history_per_store_shows_versions_snapshots_and_deletions(
    maintained: StoreStream,
) -> None:
    store = maintained.stores[0]
    result = statestore(maintained, "history", "--store", str(store), "--json")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    assert [e["ref"].split("_")[0] for e in entries] == [str(v) for v in range(15, 0, -1)]
    by_version = {int(e["ref"].split("_")[0]): e for e in entries}
    committed = maintained.committed[store]
    for version, entry in by_version.items():
        info = committed[version - 1]
        assert entry["ref"] == f"{version}_{info.checkpoint_id}"
        assert entry["batch_id"] == version - 1 and entry["query_id"] == "query-1"
        assert entry["rows"] == len(maintained.expected(store, version))
        assert entry["key"] == str(maintained.key(store))
    delta_1 = by_version[1]["files"]
    assert [(f["kind"], f["state"]) for f in delta_1] == [("delta", "deleted")]
    assert delta_1[0]["deletion_reason"].startswith("superseded")
    assert [f["kind"] for f in by_version[12]["files"]] == ["delta", "snapshot"]
    assert by_version[12]["files"][1]["verification"] == "verified"
    assert by_version[13]["files"][0]["deleted_at"] is None

    table = statestore(maintained, "history", "--store", str(store), "--limit", "4")
    assert table.exit_code == 0, table.output
    assert "History (4 committed versions, newest first)" in table.output
    assert f"root: {maintained.root}" in table.output  # once; each line names the store
    assert "  0/0/default v15: snapshot state/0/0/default/15_" in table.output
    assert table.output.count(maintained.root) == 1


def test_history_by_batch_of_a_query(maintained: StoreStream) -> None:
    result = statestore(maintained, "history", "--query", "query-1", "--by-batch", "--json")
    batches = json.loads(result.output)
    assert [b["batch_id"] for b in batches] == list(range(14, -1, -1))
    assert {b["stores"] for b in batches} == {3}
    assert batches[0]["snapshots"] == 3 and batches[-1]["deleted_files"] == 3
    none = statestore(maintained, "history", "--query", "no-such-query", "--json")
    assert none.exit_code == 2 and none.stdout == ""
    assert "--query 'no-such-query': no such query committed below" in none.stderr
    assert "(known: query-1)" in none.stderr
    table = statestore(maintained, "history", "--by-batch", "--limit", "6")
    assert "History (6 micro-batches, newest first)" in table.output  # whole batches


def test_health_json_is_complete(maintained: StoreStream) -> None:
    assert statestore(maintained, "validate").exit_code == 0
    [row] = json.loads(statestore(maintained, "health", "--json", "--store", "0/1/default").output)
    assert (
        row["store"] == str(maintained.key(maintained.stores[1])) and row["name"] == "0/1/default"
    )
    assert row["status"] == "healthy" and row["status_since"]
    snapshot_15 = maintained.committed[maintained.stores[1]][-1]
    assert row["last_snapshot"] == {
        "version": 15,
        "written_at": row["last_snapshot"]["written_at"],
        "deltas_since": 0,
        "chain_since": None,
    }
    assert row["last_snapshot"]["written_at"] > snapshot_15.created_at.isoformat()
    assert row["last_run"]["kind"] == "cleanup" and row["last_run"]["outcome"] == "succeeded"
    assert row["last_validated_at"] and row["latest_version"] == 15
    # deltas 1..12 and 15 are gone: 12..15 load (from snapshot 12 or 15), 1..11 do not
    assert row["versions_retained"] == 4


def test_every_command_speaks_json(maintained: StoreStream) -> None:
    latest = maintained.committed[maintained.stores[0]][-2]  # delta 14: after snapshot 12
    commands = [
        ["maintain"],
        ["validate"],
        ["health"],
        ["history"],
        ["explain", str(maintained.storage.root / latest.path)],
        ["repair"],
        ["repair", "--execute"],
        ["resolve", "--store", "0/0/default", "--reason", "checked by hand"],
        ["reconcile", "--dry-run"],
    ]
    for command in commands:
        result = statestore(maintained, *command, "--json")
        # health: validated and healthy (0) once "validate" ran above it
        assert result.exit_code == 0, (command, result.output)
        assert json.loads(result.output) is not None, command
    explained = json.loads(statestore(maintained, "explain", latest.path, "--json").output)
    assert explained["explanation"]["verdict"] == "needed"
    assert explained["explanation"]["file"]["path"] == latest.path


def test_store_names_as_health_prints_them(
    maintained: StoreStream, make_stream: Callable[..., StoreStream]
) -> None:
    table = statestore(maintained, "health")
    assert "0/0/default" in table.output
    short = statestore(maintained, "health", "--json", "--store", "0/0/default")
    full = statestore(
        maintained, "health", "--json", "--store", str(maintained.key(maintained.stores[0]))
    )
    assert json.loads(short.output)[0]["store"] == json.loads(full.output)[0]["store"]
    unknown = statestore(maintained, "history", "--store", "0/9/default")
    assert unknown.exit_code == 2 and unknown.stdout == ""
    assert unknown.stderr.count("\n") == 1
    assert "no store 0/9/default below" in unknown.stderr and "0/0/default" in unknown.stderr

    make_stream("second").run(1)  # a second root: the short name is ambiguous
    ambiguous = statestore(maintained, "history", "--store", "0/0/default")
    assert ambiguous.exit_code == 2 and "2 roots are in scope" in ambiguous.stderr
    narrowed = statestore(
        maintained, "--root", str(maintained.storage.root), "history", "--store", "0/0/default"
    )
    assert narrowed.exit_code == 0, narrowed.output


def test_version_and_defaults_in_help() -> None:
    from click.testing import CliRunner

    runner = CliRunner(env={"COLUMNS": "200"})
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("statestore, version ")
    maintain = " ".join(runner.invoke(main, ["maintain", "--help"]).output.split())
    assert "[default: (1h, or STATE_MAINTENANCE_WINDOW)]" in maintain
    assert "[default: dry-run]" in maintain
    assert "[default: (unset, or STATE_MAINTENANCE_WORKERS); 1<=x<=2147483647]" in maintain
    top = " ".join(runner.invoke(main, ["--help"]).output.split())
    assert "[default: default]" in top and "history" in top


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_piped_output_is_never_cut(tmp_path: Path, make_stream: Callable[..., StoreStream]) -> None:
    """A real ``statestore`` process piped through ``cat`` (not a terminal) with
    ``COLUMNS=80``: every line fits in 80 columns (a table too wide for that is shown one
    block per row, a root too long for a line is folded below its label), nothing is cut, the
    root is printed once, and the rows show the stores below it."""
    deep = "a-checkpoint-folder-with-a-long-name-" * 4
    stream = make_stream(f"{deep}/nested-{deep}/checkpoint")
    stream.run(3)
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    exe = Path(sys.executable).parent / "statestore"
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "80", "HOME": str(tmp_path)}
    env |= {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}  # a worktree's code
    for command in ("health", "health --table", "history", "maintain"):
        piped = subprocess.run(
            f"'{exe}' -q --catalog-url '{url}' {command} | cat",
            shell=True,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        assert "…" not in piped.stdout, piped.stdout
        lines = piped.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), piped.stdout
        if command != "maintain":
            start = lines.index("root:")
            folded = lines[start + 1 : start + 1 + -(-len(stream.root) // 80)]
            assert [len(line) for line in folded[:-1]] == [80] * (len(folded) - 1)
            assert "".join(folded) == stream.root  # the whole root, once, above the rows
            assert piped.stdout.replace("\n", "").count(stream.root) == 1
        if command in ("health --table", "history"):
            assert "store: 0/0/default" in [line.strip() for line in lines], piped.stdout
        if command == "health":  # below 120 columns: one line per store
            stores = [line for line in lines if line.startswith(("0/", "1/"))]
            assert len(stores) == 3 and "health: 3 store(s)" not in piped.stdout
            assert stores[0].split()[:3] == ["0/0/default", "unknown", "since"], stores
            assert stores[0].endswith("never validated"), stores
        if command == "maintain":
            assert "snapshots (dry run): 0 store(s) due" in lines
