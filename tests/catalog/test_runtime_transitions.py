"""The runtime role may make the commit protocol's transitions on the tables that hold history,
and no other (real PostgreSQL, roles granted by ``grants --apply``).

Its table-wide UPDATE once let one statement, ``UPDATE checkpoint_files SET state = 'orphan'``,
mark every committed file of every store as never committed; the next routine ``maintain
--execute`` then deleted them all. Now each destructive statement is refused (SQLSTATE 42501)
and changes nothing, while the runtime's own calls (begin and commit batches, a replayed
batch, schemas, holders, metrics, watermarks) still work as that role, and maintenance after
them keeps every retained version loadable.

On ``store_problems`` the runtime opens the loss behind a batch it cannot load, and resolves
it only as a replay's commit that replaced the lost file's checkpoint: every other change is
refused, and a catalog upgraded from revision 0014 gets the grant.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command

from state_runtime.catalog import BatchCommit, Catalog, FoundProblem
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import alembic_config, upgrade
from state_runtime.cli.exits import MONITOR_BROKEN, MONITOR_UNKNOWN
from state_runtime.errors import CatalogSchemaOutdated, StateLost
from state_runtime.identity import CheckpointRef
from state_runtime.runtime.loss import lost_state
from state_runtime.storage import LocalStorage
from state_runtime.store.checkpoint_info import CheckpointInfo
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
from tests.maintenance.streams import StoreStream

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
    the loss. It may open a problem, and not resolve it while a committed version reads the
    file."""
    stream = runtime_stream(roles, tmp_path)
    latest = lose_the_latest(stream)
    stream.catalog.close()
    assert rows(roles.owner, "SELECT path FROM store_problems WHERE resolved_at IS NULL") == [
        (latest.path,)
    ]
    assert "may only be resolved, once, when no committed version reads its file" in refused(
        roles.runtime, "UPDATE store_problems SET resolved_at = now(), resolution = 'hidden'"
    )


def lose_the_latest(stream: StoreStream) -> CheckpointInfo:
    """Store 0's latest delta deleted; the next batch fails on it and the runtime records the
    loss (StateLost naming the file); the lost file's record."""
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
    assert isinstance(lost, StateLost) and latest.path in str(lost)
    return latest


def replay_the_last(stream: StoreStream) -> BatchCommit:
    """The last batch again, as a new driver replays it: every store's latest version written
    anew (new checkpoint ids) and committed in its place."""
    for store in STORES:
        stream.committed[store].pop()
        stream.states[store].pop()
        stream.providers[store] = stream.provider(store)  # a new driver's workers
    written = {store: stream.write(store) for store in STORES}
    infos = [info for info, _ in written.values()]
    commit = stream.catalog.commit_batch(stream.root, stream.query, stream.batch - 1, infos)
    for store, (info, state) in written.items():
        stream.committed[store].append(info)
        stream.states[store].append(state)
    return commit


PROBLEMS = "SELECT * FROM store_problems ORDER BY problem_id"


def test_a_replay_that_writes_the_lost_version_again_resolves_its_problem(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    """As the runtime role: the lost file's problem is resolved by the replay's commit, which
    sets only ``resolved_at`` and ``resolution``; ``health`` no longer calls the store broken."""
    stream = runtime_stream(roles, tmp_path)
    lost = lose_the_latest(stream)
    (opened,) = rows(roles.owner, PROBLEMS)
    assert cli(roles.reader, "--root", stream.root, "health").exit_code == MONITOR_BROKEN
    commit = replay_the_last(stream)
    assert commit.closed_problems == 1 and STORES[0] in commit.replaced
    (problem,) = stream.catalog.problems(root=stream.root, only_open=False)
    assert problem.path == lost.path and problem.resolved_at is not None
    assert problem.resolution is not None
    assert f"batch {stream.batch - 1} of query {stream.query}" in problem.resolution
    (closed,) = rows(roles.owner, PROBLEMS)
    changed = {k for k, (a, b) in enumerate(zip(opened, closed, strict=True)) if a != b}
    columns = [r[0] for r in rows(roles.owner, COLUMNS)]
    assert {columns[k] for k in changed} == {"resolved_at", "resolution"}
    assert stream.catalog.problems(root=stream.root) == []
    stream.catalog.close()
    health = cli(roles.reader, "--root", stream.root, "health")
    assert health.exit_code == MONITOR_UNKNOWN, health.output  # never validated; not broken


COLUMNS = (
    "SELECT column_name FROM information_schema.columns WHERE table_name = 'store_problems' "
    "AND table_schema = current_schema() ORDER BY ordinal_position"
)
PROBLEM_EDITS = [
    ("UPDATE store_problems SET resolved_at = now(), resolution = 'x'", "may only be resolved"),
    (
        "UPDATE store_problems SET resolved_at = now(), resolution = 'x' WHERE path IS NULL",
        "may only be resolved",
    ),
    (
        "UPDATE store_problems SET resolved_at = NULL, resolution = NULL "
        "WHERE resolved_at IS NOT NULL",
        "may only be resolved",
    ),
    (
        "UPDATE store_problems SET resolution = 'rewritten' WHERE resolved_at IS NOT NULL",
        "may only be resolved",
    ),
    ("UPDATE store_problems SET resolved_at = now() WHERE resolved_at IS NOT NULL", "may only"),
    ("UPDATE store_problems SET problem = 'nothing'", "permission denied for table"),
    ("UPDATE store_problems SET path = NULL", "permission denied for table"),
    ("UPDATE store_problems SET resolved_by_run = NULL", "permission denied for table"),
    ("DELETE FROM store_problems", "permission denied for table"),
    ("TRUNCATE store_problems", "permission denied for table"),
]


def test_the_runtime_may_do_nothing_else_to_a_problem(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    """With a problem the replay resolved, an open one about a file the latest commit reads
    and an open one about no file: every other change as the runtime role is refused, and
    nothing changes."""
    stream = runtime_stream(roles, tmp_path)
    lose_the_latest(stream)
    replay_the_last(stream)
    lose_the_latest(stream)
    stream.catalog.add_problems(stream.key(STORES[1]), [FoundProblem("damaged by hand")])
    stream.catalog.close()
    before = rows(roles.owner, PROBLEMS)
    assert len(before) == 3 and sum(r[-1] is None for r in before) == 2  # resolution
    for statement, why in PROBLEM_EDITS:
        assert why in refused(roles.runtime, statement), statement
        assert rows(roles.owner, PROBLEMS) == before, statement


def downgrade(url: str, revision: str) -> None:
    """Alembic's downgrade to ``revision``, as the owner, in one transaction."""
    engine = create_catalog_engine(url)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def test_a_catalog_upgraded_from_0014_lets_a_replay_resolve_the_loss(
    roles: Roles,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A catalog granted at revision 0014 (the runtime may not update ``store_problems``, no
    guard on it: what the downgrade leaves): the runtime cannot even open it, so no replay can
    meet the missing grant; the owner's upgrade grants it again, and the replay resolves the
    loss as the runtime role."""
    stream = runtime_stream(roles, tmp_path)
    lose_the_latest(stream)
    stream.catalog.close()
    runtime = roles.names["runtime"]
    rights = (
        f"SELECT has_column_privilege('{runtime}', 'store_problems', 'resolved_at', 'UPDATE'), "
        f"has_column_privilege('{runtime}', 'store_problems', 'resolution', 'UPDATE'), "
        f"has_column_privilege('{runtime}', 'store_problems', 'problem', 'UPDATE'), "
        f"has_table_privilege('{runtime}', 'store_problems', 'DELETE'), "
        "(SELECT count(*) FROM pg_trigger WHERE tgrelid = 'store_problems'::regclass "
        "AND tgname = 'state_protocol_guard')"
    )
    downgrade(roles.owner, "0014_idle_commits")
    assert rows(roles.owner, rights) == [(False, False, False, False, 0)]
    with pytest.raises(CatalogSchemaOutdated, match="0014_idle_commits"):
        Catalog.open(roles.runtime, upgrade="sqlite")  # as StatefulQuery opens it
    upgrade(create_catalog_engine(roles.owner))
    assert rows(roles.owner, rights) == [(True, True, False, False, 1)]
    stream.catalog = Catalog.open(roles.runtime, upgrade="sqlite")
    assert replay_the_last(stream).closed_problems == 1
    assert stream.catalog.problems(root=stream.root) == []
    stream.catalog.close()
