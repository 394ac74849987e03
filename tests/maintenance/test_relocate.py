"""``statestore relocate``: a root moved elsewhere is recorded there once its files are found,
on SQLite and PostgreSQL catalogs (a PostgreSQL catalog cannot move with its root)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from state_runtime.errors import InvalidArgument
from state_runtime.maintenance import Fleet, MaintenancePolicy, relocate_root, run_checks
from state_runtime.storage import LocalStorage
from tests.maintenance.conftest import STORES
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import statestore


def test_a_moved_root_is_recorded_at_its_new_home(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream("old")
    stream.run(5)
    catalog, old = stream.catalog, stream.storage
    catalog.fix_watermark(old.uri, stream.query, 5, 1_000)  # what an event-time query records
    new = LocalStorage(old.root.parent / "new")

    dry = statestore(stream, "relocate", str(old.root), str(new.root), "--json")
    assert dry.exit_code == 1, dry.output  # nothing is there yet
    plan = json.loads(dry.output)
    assert plan["files_checked"] == len(plan["missing"]) > 0 and not plan["executed"]
    refused = statestore(stream, "relocate", str(old.root), str(new.root), "--execute")
    assert refused.exit_code == 3, refused.output
    assert "not at" in refused.output and catalog.roots() == [old.uri]

    shutil.copytree(old.root, new.root)
    shutil.rmtree(old.root)
    moved = statestore(stream, "relocate", str(old.root), str(new.root), "--execute")
    assert moved.exit_code == 0, moved.output
    assert f"{len(STORES)} store(s) now recorded below {new.uri}" in moved.output
    assert catalog.roots() == [new.uri]
    watermark = catalog.batch_watermark(new.uri, stream.query, 5)
    assert watermark is not None and watermark.watermark_ms == 1_000
    assert catalog.batch_watermark(old.uri, stream.query, 5) is None

    there = StoreStream(catalog, new, list(STORES), register=False)
    for store in STORES:
        for version in range(1, 6):
            ref = stream.committed[store][version - 1].ref
            loaded = there.provider(store).get_read_store(version, ref.checkpoint_id)
            assert {k[0]: v[0] for k, v in loaded.items()} == stream.expected(store, version)
    report = run_checks(Fleet(catalog, owner="tests"), MaintenancePolicy())
    assert report.ok, [o.summary for o in report.outcomes if not o.passed]


def test_relocating_onto_a_known_root_or_from_an_unknown_one_is_refused(
    make_stream: Callable[..., StoreStream],
) -> None:
    first, second = make_stream("first"), make_stream("second")
    first.run(2)
    second.run(2)
    catalog = first.catalog
    with pytest.raises(InvalidArgument, match="already records stores below"):
        relocate_root(catalog, first.storage.uri, second.storage, dry_run=False)
    unknown = statestore(first, "relocate", str(first.storage.root / "nowhere"), "/tmp/x")
    assert unknown.exit_code == 2, unknown.output
    assert sorted(catalog.roots()) == sorted([first.storage.uri, second.storage.uri])
