"""``statestore`` on a damaged store: health shows it broken (table and JSON), explain never
calls a missing file needed, maintain says which store it holds, repair rebuilds, resolve."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable

import pytest

from state_runtime.identity import StoreId
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore
from tests.maintenance.test_safety import damage, snapshot_file


@pytest.fixture
def stream(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """Two stores, 8 versions, a verified snapshot at 6, validated."""
    stream = make_stream(stores=[StoreId(0, 0), StoreId(0, 1)])
    stream.run(6)
    assert statestore(stream, "maintain", "--execute", "--min-deltas", "5").exit_code == 0
    stream.run(2)
    assert statestore(stream, "validate").exit_code == 0
    return stream


def test_health_explain_maintain_repair_on_a_damaged_snapshot(stream: StoreStream) -> None:
    store = stream.stores[0]
    snap = snapshot_file(stream, store)
    relative = snap.relative_to(stream.storage.root).as_posix()
    healthy = json.loads(statestore(stream, "health", "--json").output)
    assert {row["status"] for row in healthy} == {"healthy"}

    damage(snap)
    assert statestore(stream, "validate", "--full").exit_code == 1  # in place, size kept
    rows = {r["store"]: r for r in json.loads(statestore(stream, "health", "--json").output)}
    broken = rows[str(stream.key(store))]
    assert broken["status"] == "broken" and relative in broken["status_reason"]
    assert broken["open_problems"] == 1 and broken["status_since"]
    table = statestore(stream, "health", "--sort", "status")
    assert table.exit_code == 2 and re.search(r"0/0/default\s.*broken", table.output)

    explained = statestore(stream, "explain", str(snap))
    assert "verdict: damaged" in explained.output
    assert "no retained version is lost" in explained.output
    assert "store status: broken" in explained.output

    plan = statestore(stream, "maintain")
    assert plan.exit_code == 0, plan.output
    assert "held: 1 store(s) with open validation problems" in plan.output
    assert f"{stream.key(store)}: held since" in plan.output

    dry = statestore(stream, "repair")
    assert dry.exit_code == 0 and "1 damaged snapshot(s) to rebuild" in dry.output
    assert len(dry.output.splitlines()) <= 8 and f"#{store}: snapshot {relative}" in dry.output
    assert "checksum" in dry.output  # the cause
    [command] = re.findall(r"run `(statestore [^`]+)`", dry.output)
    assert command == f"statestore --root {stream.root} repair --store {store} --execute"
    done = statestore(stream, *shlex.split(command)[1:])  # run as printed
    assert done.exit_code == 0, done.output
    assert re.search(r"repair \(run \d+\): 1 repaired", done.output)
    for version in (6, 7, 8):
        assert stream.loaded(store, version) == stream.expected(store, version)
    rows = {r["store"]: r for r in json.loads(statestore(stream, "health", "--json").output)}
    assert rows[str(stream.key(store))]["status"] == "healthy"
    assert (
        "held" not in statestore(stream, "maintain", "--window", "0s", "--min-window", "0s").output
    )


def test_explain_says_what_a_missing_delta_loses_and_resolve_unholds(stream: StoreStream) -> None:
    store = stream.stores[1]
    newest = stream.committed[store][-1]
    (stream.storage.root / newest.path).unlink()
    explained = statestore(stream, "explain", str(stream.storage.root / newest.path))
    assert explained.exit_code == 0
    assert "verdict: missing" in explained.output and "verdict: needed" not in explained.output
    assert "lost: retained version 8" in explained.output
    assert "still loadable from intact files: retained version 7" in explained.output

    assert statestore(stream, "validate").exit_code == 1
    key = str(stream.key(store))
    resolved = statestore(stream, "resolve", "--store", key, "--reason", "accepted the loss")
    assert resolved.exit_code == 0 and f"{key}: 1 open problem(s) resolved" in resolved.output
    [problem] = stream.catalog.problems(root=stream.root, only_open=False)
    assert problem.resolution == "resolved by hand: accepted the loss"
    assert "held" not in statestore(stream, "maintain", "--no-snapshots").output
