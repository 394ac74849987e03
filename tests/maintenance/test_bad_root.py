"""One bad root stops the maintenance of no other root.

A root the catalog recorded but storage cannot open (``s3://b/x``: storage refuses the
bucket name ``b``) once made fleet-wide ``maintain``, ``validate`` and ``reconcile`` exit 2
("bad input, nothing was done") for every root. Now the catalog refuses such a root when it
is first recorded (storage's own rule), and a root recorded by older code is set aside by
name (exit 1, "some work failed") while every other root is maintained.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId
from tests.maintenance.streams import KEY, VALUE, StoreStream
from tests.maintenance.test_cli import files, statestore

BAD_ROOT = "s3://b/x"


@pytest.mark.parametrize(
    "root", [BAD_ROOT, "s3://Bad_Bucket/x", "s3://ok-bucket/../x", "file://host/x", "hdfs://n/x"]
)
def test_the_catalog_records_no_root_storage_refuses(catalog: Catalog, root: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^(\[\w+\] )?(invalid|unsupported)"):
        catalog.register_store(root, StoreId(0, 0), KEY, VALUE)
    assert catalog.roots() == []


def record_as_older_code_did(catalog: Catalog, root: str) -> None:
    """A store below ``root`` as code before the shared rule recorded it (a plain insert)."""
    with catalog.engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO stores (checkpoint_root, operator_id, partition_id, store_name, "
                "key_schema, value_schema, created_at, latest_version) "
                "VALUES (:root, 0, 0, 'default', :key, :value, :now, 0)"
            ),
            {"root": root, "key": f'"{KEY}"', "value": f'"{VALUE}"', "now": datetime.now(UTC)},
        )


@pytest.fixture
def two_roots(make_stream: Callable[..., StoreStream]) -> StoreStream:
    """A good root with 3 stores and 12 versions each, and the bad root beside it."""
    stream = make_stream()
    stream.run(12)
    record_as_older_code_did(stream.catalog, BAD_ROOT)
    assert set(stream.catalog.roots()) == {stream.root, BAD_ROOT}
    return stream


def assert_set_aside(output: str) -> None:
    assert re.search(
        rf"root {re.escape(BAD_ROOT)} was not maintained \(some work failed\): "
        r"(\[\w+\] )?invalid S3 bucket name 'b'",
        output,
    ), output


def test_maintain_sets_the_bad_root_aside_and_maintains_the_others(two_roots: StoreStream) -> None:
    before = files(two_roots)
    result = statestore(two_roots, "maintain", "--execute")
    assert result.exit_code == 1, result.output
    assert_set_aside(result.stderr)
    assert re.search(r"snapshots \(run \d+\): 3 written", result.stdout), result.stdout
    assert len(files(two_roots)) == len(before) + 3  # the good root's snapshots are on disk
    # and they load: the good root validates cleanly, the bad one is named again
    validated = statestore(two_roots, "validate")
    assert validated.exit_code == 1, validated.output
    assert_set_aside(validated.stderr)
    assert "ERROR" not in validated.stdout and "lineage_valid" in validated.stdout


def test_reconcile_sets_the_bad_root_aside(two_roots: StoreStream) -> None:
    (two_roots.storage.root / "state/0/0/default/stray.txt").write_bytes(b"?")  # foreign
    result = statestore(two_roots, "reconcile", "--dry-run")
    assert result.exit_code == 1, result.output
    assert_set_aside(result.stderr)
    assert "listed 37 files" in result.stdout and "1 not checkpoint files" in result.stdout


def test_only_the_good_root_exits_zero(two_roots: StoreStream) -> None:
    result = statestore(two_roots, "--root", two_roots.root, "maintain", "--execute")
    assert result.exit_code == 0, result.output
