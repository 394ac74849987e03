"""The runtime role may make the commit protocol's transitions on the tables that hold history,
and no other (real PostgreSQL, roles granted by ``grants --apply``).

Its table-wide UPDATE once let one statement, ``UPDATE checkpoint_files SET state = 'orphan'``,
mark every committed file of every store as never committed; the next routine ``maintain
--execute`` then deleted them all. Now each destructive statement is refused (SQLSTATE 42501)
and changes nothing, while the runtime's own calls (begin and commit batches, a replayed
batch, schemas, holders, metrics, watermarks) still work as that role, and maintenance after
them keeps every retained version loadable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from state_runtime.errors import StateLost
from state_runtime.identity import CheckpointRef
from state_runtime.runtime.loss import lost_state
from state_runtime.storage import LocalStorage
from tests.catalog.test_roles import (  # noqa: F401  (the roles fixture)
    STORES,
    Roles,
    cli,
    counts,
    refused,
    roles,
    rows,
    runtime_stream,
)

pytestmark = pytest.mark.postgres

DESTRUCTIVE = [
    ("UPDATE checkpoint_files SET state = 'orphan'", "may not move from committed to orphan"),
    ("UPDATE checkpoint_files SET state = 'deleted'", "may not move from"),
    ("UPDATE checkpoint_files SET state = 'committed'", "commit log does not name it"),
    ("UPDATE checkpoint_files SET path = 'elsewhere'", "permission denied for table"),
    ("UPDATE checkpoint_files SET claimed_by_run = NULL", "permission denied for table"),
    ("UPDATE commit_log SET checkpoint_id = 'x'", "may name only a recorded file"),
    ("UPDATE commit_log SET file_id = file_id + 1", "may name only a recorded file"),
    ("UPDATE commit_log SET version = version + 100", "permission denied for table"),
    ("UPDATE stores SET latest_version = 0, latest_checkpoint_id = NULL", "may not name version"),
    ("UPDATE stores SET latest_version = latest_version - 1", "may not name version"),
    (
        "UPDATE stores s SET latest_version = c.version, latest_checkpoint_id = c.checkpoint_id "
        "FROM commit_log c WHERE c.store_id = s.store_id AND c.version = s.latest_version - 1",
        "may not move back",
    ),
    ("UPDATE stores SET checkpoint_root = '/elsewhere'", "permission denied for table"),
]


@pytest.mark.parametrize(("statement", "why"), DESTRUCTIVE)
def test_a_destructive_update_is_refused_as_the_runtime(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
    statement: str,
    why: str,
) -> None:
    stream = runtime_stream(roles, tmp_path)  # a replayed batch among its commits
    stream.catalog.close()
    before = rows(roles.owner, "SELECT * FROM checkpoint_files ORDER BY file_id")
    log = rows(roles.owner, "SELECT * FROM commit_log ORDER BY commit_id")
    assert why in refused(roles.runtime, statement)
    assert rows(roles.owner, "SELECT * FROM checkpoint_files ORDER BY file_id") == before
    assert rows(roles.owner, "SELECT * FROM commit_log ORDER BY commit_id") == log


def test_after_the_refusal_maintenance_deletes_no_committed_file(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    stream = runtime_stream(roles, tmp_path)
    stream.catalog.close()
    refused(roles.runtime, "UPDATE checkpoint_files SET state = 'orphan'")
    # maintenance itself may still move history (its passes keep their own rules)
    assert rows(roles.owner, "SELECT count(*) FROM checkpoint_files WHERE state = 'orphan'")
    done = cli(roles.maintenance, "--policy", "demo", "maintain", "--execute")
    assert done.exit_code == 0, done.output
    assert counts(roles.owner)[4] > 0  # it did delete what retention allows
    for store in STORES:
        latest = len(stream.committed[store])
        for version in (latest - 1, latest):
            assert stream.loaded(store, version) == stream.expected(store, version)
    assert cli(roles.maintenance, "validate").exit_code == 0


def test_a_commit_below_the_latest_is_history_to_the_runtime(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A replay replaces only a store's latest version. Re-pointing an older version's entry at
    another recorded file of that version (here the originals the replay of batch 9 replaced,
    once batch 10 committed on top) would let the runtime then orphan the file the versions
    above build on, for cleanup to delete: refused, and nothing changes."""
    stream = runtime_stream(roles, tmp_path)
    stream.run(1)  # version 11 on top of the replayed version 10
    stream.catalog.close()
    log = rows(roles.owner, "SELECT * FROM commit_log ORDER BY commit_id")
    why = refused(
        roles.runtime,
        "UPDATE commit_log c SET checkpoint_id = f.checkpoint_id, file_id = f.file_id "
        "FROM checkpoint_files f WHERE f.store_id = c.store_id AND f.version = c.version "
        "AND f.file_id <> c.file_id AND c.version = 10",
    )
    assert "version 10 is not its latest" in why
    assert rows(roles.owner, "SELECT * FROM commit_log ORDER BY commit_id") == log


def test_the_runtime_records_the_loss_behind_a_batch_it_cannot_load(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A failed batch whose base file is gone raises StateLost and records the problem, so
    that ``health`` calls the store broken. As the runtime role, recording it was refused
    (no INSERT on ``store_problems``): the driver raised CatalogPermissionDenied instead of
    the loss. It may open a problem, and still resolve none."""
    stream = runtime_stream(roles, tmp_path)
    assert isinstance(stream.storage, LocalStorage)
    store = STORES[0]
    latest = stream.committed[store][-1]
    (stream.storage.root / latest.path).unlink()
    lost = lost_state(
        stream.catalog,
        stream.storage,
        stream.query,
        stream.batch,
        {store: CheckpointRef(latest.version, latest.checkpoint_id)},
        RuntimeError("a task of the batch failed"),
    )
    stream.catalog.close()
    assert isinstance(lost, StateLost) and latest.path in str(lost)
    assert rows(roles.owner, "SELECT path FROM store_problems WHERE resolved_at IS NULL") == [
        (latest.path,)
    ]
    assert "permission denied for table store_problems" in refused(
        roles.runtime, "UPDATE store_problems SET resolved_at = now()"
    )
