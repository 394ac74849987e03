"""``statestore`` through click's CliRunner, on real files and SQLite / PostgreSQL catalogs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from state_runtime.cli import main
from state_runtime.identity import StoreId
from tests.maintenance.streams import StoreStream


@pytest.fixture
def stream(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Three stores with 12 committed versions and one orphan."""
    stream = make_stream()
    stream.run(11)
    stream.abandoned_attempt(stream.stores[0])
    stream.run(1)
    return stream


def statestore(stream: StoreStream, *args: str, env: dict[str, str] | None = None) -> Result:
    url = stream.catalog.engine.url.render_as_string(hide_password=False)
    runner = CliRunner(env={"COLUMNS": "250", "STATE_CATALOG_URL": None} | (env or {}))
    return runner.invoke(main, ["--catalog-url", url, "-q", *args], catch_exceptions=False)


def files(stream: StoreStream) -> set[str]:
    root = stream.storage.root
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_health_table_and_json(stream: StoreStream) -> None:
    table = statestore(stream, "health")
    assert table.exit_code == 3, table.output  # never validated: unknown, for a monitor
    assert f"root: {stream.root}" in table.output
    assert "health: 3 store(s): 3 unknown" in table.output and "1/0/sessions" in table.output
    data = json.loads(statestore(stream, "health", "--json", "--sort", "orphans").output)
    assert data[0]["store"] == str(stream.key(stream.stores[0]))
    assert {d["latest_version"] for d in data} == {12}
    assert {d["deltas_since_snapshot"] for d in data} == {12}
    assert data[0]["orphan_files"] == 1
    assert len(json.loads(statestore(stream, "health", "--json", "--limit", "2").output)) == 2


def test_maintain_is_a_dry_run_unless_executed(stream: StoreStream) -> None:
    before = files(stream)
    dry = statestore(stream, "maintain", "--window", "10m", "--min-window", "10m")
    assert dry.exit_code == 0, dry.output
    assert "snapshots (dry run): 3 store(s) due" in dry.output
    assert "cleanup (dry run): would delete 0 files" in dry.output
    assert files(stream) == before

    done = statestore(stream, "maintain", "--execute")
    assert done.exit_code == 0, done.output
    assert re.search(r"snapshots \(run \d+\): 3 written", done.output)
    assert re.search(r"cleanup \(run \d+\): deleted 0 files", done.output)  # all are young
    assert len(files(stream)) == len(before) + 3


def test_maintain_refuses_an_unsafe_retention(stream: StoreStream) -> None:
    result = statestore(stream, "maintain", "--execute", "--window", "1m")
    assert result.exit_code == 3
    assert (
        "refused: [STATE_MAINTENANCE_REFUSED] retention window 1m is shorter than the configured "
        "minimum of 10m" in result.stderr
    )
    floor = statestore(stream, "maintain", "--execute", "--retain-versions", "1")
    assert floor.exit_code == 3 and "below the safety floor of 2" in floor.stderr
    assert stream.catalog.recent_runs() == []


def test_validate_passes_then_names_a_deleted_delta(stream: StoreStream) -> None:
    ok = statestore(stream, "validate")
    assert ok.exit_code == 0, ok.output
    assert "lineage_valid" in ok.output and "ERROR" not in ok.output
    middle = stream.committed[stream.stores[2]][10]
    (stream.storage.root / middle.path).unlink()
    broken = statestore(stream, "validate", "--json")
    assert broken.exit_code == 1
    report = json.loads(broken.output)
    [lineage] = [c for c in report["checks"] if c["name"] == "lineage_valid"]
    assert [f["path"] for f in lineage["findings"]] == [middle.path]
    assert lineage["findings"][0]["store"] == str(stream.key(stream.stores[2]))


def test_explain_names_why_a_file_is_kept(stream: StoreStream) -> None:
    latest = stream.committed[stream.stores[0]][-1]
    absolute = stream.storage.root / latest.path
    by_path = statestore(stream, "explain", str(absolute))
    assert by_path.exit_code == 0, by_path.output
    assert "verdict: needed" in by_path.output
    assert "needed to load retained version 12" in by_path.output
    said = " ".join(by_path.output.split())  # as one line, however the console wrapped it
    assert f"written {latest.created_at.isoformat()} (writer's clock), recorded 20" in said
    relative = statestore(stream, "--root", str(stream.storage.root), "explain", latest.path)
    assert "verdict: needed" in relative.output
    unknown = statestore(stream, "explain", f"{stream.root}/state/0/0/default/x.delta")
    assert unknown.exit_code == 2 and "names no file the catalog records" in unknown.stderr
    (stream.storage.root / "state/0/0/default/x.delta").write_bytes(b"left by hand")
    untracked = statestore(stream, "explain", f"{stream.root}/state/0/0/default/x.delta")
    assert "verdict: untracked" in untracked.output
    outside = statestore(stream, "explain", "/elsewhere/file.delta")
    assert outside.exit_code == 2 and "below none of the catalog's roots" in outside.stderr


def test_reconcile_records_an_untracked_file(stream: StoreStream) -> None:
    store = stream.stores[1]
    lost, _ = stream.write(store)
    stream.providers[store].drop_cache()
    stream.run(1)
    result = statestore(stream, "reconcile", "--min-age", "0s")
    assert result.exit_code == 0, result.output
    assert f"recorded {lost.path} as orphan" in result.output


def test_bad_input_gives_clear_errors(stream: StoreStream, tmp_path: Path) -> None:
    bad_store = statestore(stream, "history", "--store", "nonsense")
    assert bad_store.exit_code == 2 and "invalid store 'nonsense'" in bad_store.output
    runner = CliRunner()
    down = runner.invoke(
        main, ["--catalog-url", "postgresql+psycopg2://nobody@127.0.0.1:1/none", "history"]
    )
    assert (
        down.exit_code == 4
        and "error: [STATE_CATALOG_UNAVAILABLE] cannot connect to the catalog" in down.stderr
    )
    empty = runner.invoke(main, ["--catalog-url", f"sqlite:///{tmp_path}/new.db", "history"])
    assert empty.exit_code == 4 and "upgrade" in empty.stderr
    bad_window = statestore(stream, "maintain", "--window", "soon")
    assert bad_window.exit_code == 2 and "invalid duration 'soon'" in bad_window.output


def test_explain_takes_a_path_as_typed_and_never_guesses(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path relative to the current folder (as the shell completes it) names the file it
    names, not that path joined onto a root; a path relative to a root works from anywhere;
    a path that names files below two roots, or lies below none, is refused naming them."""
    first = make_stream("a/checkpoint", stores=[StoreId(0, 0)])
    second = make_stream("b/checkpoint", stores=[StoreId(0, 0)])
    first.run(3)
    second.run(3)
    latest = first.committed[first.stores[0]][-1]
    home = first.storage.root.parent

    monkeypatch.chdir(home)  # the shell completes checkpoint/state/0/0/default/3_....delta
    typed = statestore(first, "explain", f"checkpoint/{latest.path}")
    assert typed.exit_code == 0, typed.output
    assert f"{first.root}/{latest.path}" in typed.output and "verdict: needed" in typed.output
    assert "untracked" not in typed.output

    monkeypatch.chdir(home.parent)  # from elsewhere, relative to its root, with --root
    by_root = statestore(first, "--root", first.root, "explain", latest.path)
    assert by_root.exit_code == 0 and "verdict: needed" in by_root.output

    same = statestore(first, "explain", latest.path)  # only the first root has this file
    assert same.exit_code == 0 and f"{first.root}/{latest.path}" in same.output
    for stream in (first, second):
        (stream.storage.root / "notes.txt").write_text("a file both roots hold")
    both = statestore(first, "explain", "notes.txt")
    assert both.exit_code == 2, both.output
    assert "is ambiguous" in both.stderr and first.root in both.stderr
    assert second.root in both.stderr

    outside = statestore(first, "explain", str(home.parent / "elsewhere" / "x.delta"))
    assert outside.exit_code == 2
    assert f"below none of the catalog's roots: {first.root}, {second.root}" in outside.stderr
