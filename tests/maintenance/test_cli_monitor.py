"""``statestore health`` / ``status`` exit codes for monitors (0 healthy, 1 degraded,
2 broken, 3 unknown), "did you mean" for unknown commands, and no traceback on a closed pipe
(real files; SQLite and PostgreSQL catalogs; the closed pipe through a real shell)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore


def test_health_exit_codes_follow_the_monitoring_plugin_convention(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(4)
    never = statestore(stream, "health")
    assert never.exit_code == 3 and "never validated" in never.output  # unknown, not 0
    assert statestore(stream, "--policy", "demo", "validate").exit_code == 0
    assert statestore(stream, "status").exit_code == 0  # the alias: every store healthy
    degraded = statestore(stream, "health", env={"STATE_MAINTENANCE_LAG_WARN_DELTAS": "3"})
    assert degraded.exit_code == 1 and "degraded" in degraded.output
    (stream.storage.root / stream.committed[stream.stores[0]][1].path).unlink()
    assert statestore(stream, "--policy", "demo", "validate").exit_code == 1
    broken = statestore(stream, "status", "--json")
    assert broken.exit_code == 2 and '"broken"' in broken.output
    bad = statestore(stream, "health", "--store", "9/9/none")
    assert bad.exit_code == 3 and "no store" in bad.output  # the monitor cannot tell
    usage = statestore(stream, "status", "--sort", "nonsense")
    assert usage.exit_code == 3


def test_unknown_command_suggests_the_close_one(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(1)
    typo = statestore(stream, "helth")
    assert typo.exit_code == 2
    assert "No such command 'helth'. Did you mean 'health'?" in typo.output
    far = statestore(stream, "zzz")
    assert far.exit_code == 2 and "Did you mean" not in far.output


@pytest.mark.parametrize("catalog", ["sqlite"], indirect=True)
def test_a_closed_pipe_ends_quietly(make_stream: Callable[..., StoreStream]) -> None:
    stream = make_stream()
    stream.run(200)  # the root is printed once: about 0.5 KiB of history per batch
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    exe = Path(sys.executable).with_name("statestore")
    whole = subprocess.run(
        [exe, "-q", "--catalog-url", url, "history", "--limit", "1000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert len(whole.stdout.encode()) > 65536  # more than a pipe holds: the writer meets the close
    for command in ("history --limit 1000", "history --by-batch --limit 1000"):
        piped = subprocess.run(
            f"'{exe}' -q --catalog-url '{url}' {command} | head -1",
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert len(piped.stdout.splitlines()) == 1
        assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr


def test_each_command_lists_only_the_policy_options_it_uses() -> None:
    from click.testing import CliRunner

    from state_runtime.cli import main

    runner = CliRunner(env={"COLUMNS": "120"})

    def options(command: str) -> set[str]:
        text = runner.invoke(main, [command, "--help"]).output
        found = ("--min-deltas", "--retain-versions", "--window", "--orphan-grace", "--min-window")
        return {o for o in found if f"{o} " in text}

    retention = {"--retain-versions", "--window", "--orphan-grace"}
    assert options("maintain") == retention | {"--min-deltas", "--min-window"}
    assert options("validate") == options("reconcile") == retention | {"--min-window"}
    assert options("health") == options("repair") == options("explain") == retention
    assert options("status") == retention and options("history") == set()


def test_history_by_batch_limit_counts_whole_batches(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(5)
    shown = statestore(stream, "history", "--by-batch", "--limit", "2", "--json")
    assert shown.exit_code == 0, shown.output
    batches = json.loads(shown.output)
    assert [(b["batch_id"], b["stores"]) for b in batches] == [(4, 3), (3, 3)]
    one_store = statestore(
        stream, "history", "--by-batch", "--limit", "3", "--store", "0/1/default", "--json"
    )
    assert [(b["batch_id"], b["stores"]) for b in json.loads(one_store.output)] == [
        (4, 1),
        (3, 1),
        (2, 1),
    ]
    versions = json.loads(statestore(stream, "history", "--limit", "2", "--json").output)
    assert len(versions) == 2  # without --by-batch the limit counts versions


def test_repair_says_what_it_cannot_repair(make_stream: Callable[..., StoreStream]) -> None:
    """A delta deleted by hand: no snapshot to rebuild, so repair says it cannot repair it,
    names the problem and the restore command, and exits 1 (dry run and executed)."""
    stream = make_stream()
    stream.run(4)
    lost = stream.committed[stream.stores[1]][2]
    (stream.storage.root / lost.path).unlink()
    assert statestore(stream, "--policy", "demo", "validate").exit_code == 1
    for mode in ("--dry-run", "--execute"):
        said = statestore(stream, "repair", mode)
        assert said.exit_code == 1, said.output
        assert (
            f"cannot repair: store {stream.key(stream.stores[1])}: delta {lost.path} (version 3) "
            "is missing from storage; the store does not load; batch 1 is the newest batch of "
            "query query-1 whose stores all load"
        ) in said.output
        assert f"statestore restore {stream.root} --query query-1 --to-batch 1 " in said.output
    data = json.loads(statestore(stream, "repair", "--json").output)
    assert [p["file"] for p in data["beyond_repair"]] == [lost.path]
    assert [p["fate"] for p in data["beyond_repair"]] == ["restorable"]
