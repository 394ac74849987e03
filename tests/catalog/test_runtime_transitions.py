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
