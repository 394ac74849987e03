"""Roots whose path a URI must percent-encode are maintained where their files are.

A root is recorded as its storage URI, and ``Path.as_uri`` encodes a space, ``%``, ``#`` or a
non-ASCII letter. ``parse_root`` once took the URI's path as it was written, so maintenance
opened ``/tmp/with%20space`` beside the real ``/tmp/with space``: ``validate`` called every
store broken, and cleanup and reconciliation worked on an empty folder while the real one grew.
Each folder here is real; the stores are written and committed through the runtime's own
catalog calls, then maintained through ``statestore``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument
from state_runtime.storage import LocalStorage, open_storage
from tests.maintenance.streams import StoreStream
from tests.maintenance.test_cli import files, statestore

FOLDERS = ["with space", "a+b", "100%", "c#sharp", "caf\u00e9 \u65e5\u672c", "%20literal"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_root_uri_opens_the_folder_it_names(tmp_path: object, folder: str) -> None:
    storage = LocalStorage(f"{tmp_path}/{folder}")
    assert storage.uri != str(storage.root)  # percent-encoded
    reopened = open_storage(storage.uri)
    assert isinstance(reopened, LocalStorage) and reopened.root == storage.root


@pytest.mark.parametrize("folder", FOLDERS)
def test_an_encoded_root_is_validated_cleaned_and_reconciled_in_its_folder(
    make_stream: Callable[..., StoreStream], folder: str
) -> None:
    stream = make_stream(folder)
    assert stream.storage.root.name == folder
    stream.run(11)
    orphan = stream.abandoned_attempt(stream.stores[0])
    stream.run(1)

    validated = statestore(stream, "validate")
    assert validated.exit_code == 0, validated.output
    assert "ERROR" not in validated.stdout and "lineage_valid" in validated.stdout
    health = json.loads(statestore(stream, "health", "--json").stdout)
    assert {h["status"] for h in health} == {"healthy"}, health

    store = stream.stores[1]
    untracked, _ = stream.write(store)
    stream.providers[store].drop_cache()
    reconciled = statestore(stream, "reconcile", "--min-age", "0s")
    assert reconciled.exit_code == 0, reconciled.output
    assert f"recorded {untracked.path} as " in reconciled.stdout

    before = files(stream)
    zero = ("--window", "0s", "--min-window", "0s", "--orphan-grace", "0s")
    done = statestore(stream, "maintain", "--execute", "--min-deltas", "1", *zero)
    assert done.exit_code == 0, done.output
    deleted = int(re.search(r"cleanup \(run \d+\): deleted (\d+) files", done.stdout)[1])  # type: ignore[index]
    after = files(stream)
    assert deleted > 0 and len(before - after) == deleted
    assert orphan.path not in after and untracked.path not in after
    for s in stream.stores:  # the retained versions still load from the real folder
        assert stream.loaded(s, 12) == stream.expected(s, 12)
    assert statestore(stream, "validate").exit_code == 0


@pytest.mark.parametrize("prefix", ["with space", "100%", "c#sharp", "caf\u00e9"])
def test_an_s3_prefix_needing_encoding_is_refused_not_misplaced(prefix: str) -> None:
    """S3 roots are used as written (never decoded), and a prefix segment outside the key
    rule is refused by name when the root is first recorded, so none is maintained elsewhere."""
    with pytest.raises(InvalidArgument, match=r"invalid (storage path|S3 URI|checkpoint root)"):
        open_storage(f"s3://bucket-x/{prefix}/ckpt")


@pytest.mark.postgres
@pytest.mark.parametrize("folder", FOLDERS)
def test_the_sql_helper_spells_a_root_as_the_runtime_records_it(
    pg_catalog: Catalog,
    tmp_path: Path,
    folder: str,
) -> None:
    """``state_root_uri`` (the psql queries in ``sql/`` match a root given as a path with
    it) percent-encodes as ``Path.as_uri`` does: once, it encoded only ``%`` and a space."""
    storage = LocalStorage(tmp_path / folder)
    with pg_catalog.engine.connect() as connection:
        found = connection.execute(
            sa.text("SELECT state_root_uri(:path)"), {"path": f"{storage.root}/"}
        ).scalar_one()
    assert found == storage.uri
