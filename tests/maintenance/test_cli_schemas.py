"""``statestore schema-check`` and ``statestore history --schemas`` on a real catalog."""

from __future__ import annotations

import json
from collections.abc import Callable

from state_runtime import SchemaChange
from state_runtime.cli.exits import EXIT_PROBLEMS, EXIT_USAGE
from state_runtime.store.state_schema import StateSchema
from tests.maintenance.streams import KEY, StoreStream
from tests.maintenance.test_cli import files, statestore


def test_schema_check_answers_before_a_deployment(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(3)
    before, recorded = files(stream), stream.catalog.schema_histories(stream.root)
    check = ["schema-check", stream.root, "--query", "query-1", "--operator", "0"]
    added = statestore(stream, *check, "--value-schema", "count bigint, best bigint")
    assert added.exit_code == 0, added.output
    assert "allowed from batch 3:" in added.output
    assert "add value field best bigint (null for older rows)" in added.output
    renamed = statestore(
        stream,
        *check,
        "--value-schema",
        "n bigint, d int not null",
        "--renamed",
        "count=n",
        "--default",
        "d=0",
        "--json",
    )
    assert renamed.exit_code == 0, renamed.output
    assert json.loads(renamed.output)["actions"] == [
        "rename value field count -> n",
        "add value field d int (0 for older rows)",
    ]
    refused = statestore(stream, *check, "--value-schema", "count int, total bigint", "--json")
    assert refused.exit_code == EXIT_PROBLEMS
    verdict = json.loads(refused.output)
    assert verdict["allowed"] is False
    assert "value field 'count': bigint -> int is not a widening" in verdict["reason"]
    assert verdict["reason"].count("refused") == 1
    undeclared = statestore(stream, *check, "--value-schema", "n bigint")
    assert undeclared.exit_code == EXIT_PROBLEMS
    assert "undeclared drop or rename (declare dropped=['count']" in undeclared.output
    bad = statestore(stream, *check, "--value-schema", "n bigint", "--renamed", "count")
    assert bad.exit_code == EXIT_USAGE and "expected NAME=VALUE" in bad.output
    unknown = statestore(
        stream,
        "schema-check",
        stream.root,
        "--query",
        "query-1",
        "--operator",
        "7",
        "--value-schema",
        "n bigint",
    )
    assert unknown.exit_code == EXIT_USAGE and "no schema for operator 7" in unknown.output
    # Nothing was recorded or written by any of these.
    assert files(stream) == before
    assert stream.catalog.schema_histories(stream.root) == recorded


def test_history_shows_each_schema_change_with_its_batch(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream()
    stream.run(2)
    history = stream.catalog.schema_history(stream.root, 0, "default")
    assert history is not None
    evolved, _ = history.evolve(
        StateSchema.of(KEY, "n bigint, best int"), SchemaChange(renamed={"count": "n"}), 2
    )
    stream.catalog.record_schema_history(stream.root, 0, "default", evolved)
    shown = statestore(stream, "history", "--schemas", "--json")
    assert shown.exit_code == 0, shown.output
    rows = [r for r in json.loads(shown.output) if r["operator_id"] == 0]
    assert [(r["from_batch"], r["value_schema"]) for r in rows] == [
        (0, "count:bigint"),
        (2, "n:bigint,best:int"),
    ]
    assert rows[1]["actions"] == [
        "rename value field count -> n",
        "add value field best int (null for older rows)",
    ]
    table = statestore(stream, "history", "--schemas")
    assert "Schema history" in table.output and "rename value field count -> n" in table.output
