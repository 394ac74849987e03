"""The commit protocol on SQLite and PostgreSQL: record, commit, replay, look up."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa

from state_runtime.catalog import (
    BatchMetrics,
    Catalog,
    FileState,
    FoundProblem,
    StoreKey,
    Verification,
)
from state_runtime.catalog.schema.tables import (
    RunKind,
    checkpoint_files,
    commit_log,
    store_problems,
    stores,
)
from state_runtime.errors import CatalogError, CommitConflict, InvalidArgument
from state_runtime.identity import EMPTY, CheckpointRef, FileKind, StoreId
from tests.catalog.factory import QUERY, ROOT, Stream, info

A, B, C = StoreId(0, 0), StoreId(0, 1), StoreId(1, 0, "dedup")


def states(catalog: Catalog) -> dict[str, str]:
    with catalog.engine.connect() as connection:
        rows = connection.execute(sa.select(checkpoint_files.c.path, checkpoint_files.c.state))
        return {row.path: row.state for row in rows}


def count(catalog: Catalog, table: sa.Table) -> int:
    with catalog.engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_commit_makes_ids_visible_and_files_committed(catalog: Catalog) -> None:
    stream = Stream(catalog, [A, B, C])
    first = stream.commit()
    second = stream.commit()

    assert catalog.committed_ids(ROOT, QUERY, 0) == {i.store: i.ref for i in first}
    assert catalog.committed_ids(ROOT, QUERY, 1) == {i.store: i.ref for i in second}
    assert catalog.committed_ids(ROOT, QUERY, 2) == {}
    assert catalog.committed_ids("/other/root", QUERY, 1) == {}
    assert catalog.latest_committed(ROOT) == {i.store: i.ref for i in second}
    assert set(states(catalog).values()) == {FileState.COMMITTED}
    history = catalog.commit_history(ROOT, query_id=QUERY, store=A)
    assert [(e.batch_id, e.ref) for e in history] == [(1, second[0].ref), (0, first[0].ref)]
    assert {r.key.store: r.latest for r in catalog.stores(ROOT)} == {i.store: i.ref for i in second}


def test_record_files_is_idempotent_and_refuses_other_content(catalog: Catalog) -> None:
    delta = info(A, 1, None)
    catalog.record_files(ROOT, [delta])
    catalog.record_files(ROOT, [delta])
    assert states(catalog) == {delta.path: FileState.WRITTEN}

    with pytest.raises(CatalogError, match="other content"):
        catalog.record_files(ROOT, [replace(delta, checksum="0" * 64)])
    with pytest.raises(InvalidArgument, match="does not match its identity"):
        catalog.record_files(ROOT, [replace(delta, path="state/0/0/default/elsewhere.delta")])
    with pytest.raises(InvalidArgument, match="base checkpoint id"):
        catalog.record_files(ROOT, [info(A, 2, None)])
    assert count(catalog, checkpoint_files) == 1


def test_other_attempts_at_a_committed_version_become_orphans(catalog: Catalog) -> None:
    speculative = info(A, 1, None)
    catalog.record_files(ROOT, [speculative])
    winner = info(A, 1, None)
    catalog.commit_batch(ROOT, QUERY, 0, [winner])
    zombie = info(A, 1, None)  # a straggler that reports after the commit
    catalog.record_files(ROOT, [zombie])

    found = states(catalog)
    assert found == {
        winner.path: FileState.COMMITTED,
        speculative.path: FileState.ORPHAN,
        zombie.path: FileState.ORPHAN,
    }


def test_replayed_batch_replaces_entries_and_orphans_replaced_files(catalog: Catalog) -> None:
    stream = Stream(catalog, [A, B])
    stream.run(2)
    base = {s: stream.committed[s][0] for s in (A, B)}
    first = [stream.committed[s][1] for s in (A, B)]
    replay = [info(s, 2, base[s].checkpoint_id, lineage=(base[s].ref,)) for s in (A, B)]

    result = catalog.commit_batch(ROOT, QUERY, 1, replay)

    assert result.replaced == {i.store: i.ref for i in first}
    assert result.orphaned_files == 2
    assert catalog.committed_ids(ROOT, QUERY, 1) == {i.store: i.ref for i in replay}
    assert catalog.latest_committed(ROOT) == {i.store: i.ref for i in replay}
    found = states(catalog)
    assert all(found[i.path] == FileState.ORPHAN for i in first)
    assert all(found[i.path] == FileState.COMMITTED for i in replay)
    assert count(catalog, commit_log) == 4  # two batches, two stores; no duplicates


def test_a_replay_resolves_the_problems_about_the_files_it_replaced(catalog: Catalog) -> None:
    """A loss recorded on A's version 2 (batch 1), then batch 1 replayed with a new A and
    the same B: the problem about the replaced file is resolved in the commit, those about
    files still committed (A's version 1, B's version 2) or about no file stay open; the
    byte-identical retry resolves nothing."""
    stream = Stream(catalog, [A, B])
    stream.run(2)
    lost, base, kept = stream.committed[A][1], stream.committed[A][0], stream.committed[B][1]
    for store, found in (
        (A, FoundProblem("the delta is missing", lost.path, 2)),
        (A, FoundProblem("the delta is truncated", base.path, 1)),
        (A, FoundProblem("damaged by hand")),
        (B, FoundProblem("the delta is missing", kept.path, 2)),
    ):
        catalog.add_problems(StoreKey(ROOT, store), [found])
    replay = [info(A, 2, base.checkpoint_id, lineage=(base.ref,)), kept]

    result = catalog.commit_batch(ROOT, QUERY, 1, replay)

    assert result.replaced == {A: lost.ref} and result.closed_problems == 1
    (closed,) = [p for p in catalog.problems(root=ROOT, only_open=False) if p.resolved_at]
    assert closed.path == lost.path and closed.resolution is not None
    assert f"batch 1 of query {QUERY}" in closed.resolution
    still = {(p.key.store, p.path) for p in catalog.problems(root=ROOT)}
    assert still == {(A, base.path), (A, None), (B, kept.path)}
    assert catalog.commit_batch(ROOT, QUERY, 1, replay).closed_problems == 0
    assert len(catalog.problems(root=ROOT)) == 3


def test_a_replay_reopening_a_store_builds_on_its_commit_before_the_batch(
    catalog: Catalog,
) -> None:
    """Store C (a ``transform_with_state`` variable) skips batch 1 and is opened again in
    batch 2: where C starts in batch 2 is its batch-0 commit, and stays so when batch 2 runs
    again (not batch 2's own commit, which a replay cannot build on); its replay commits."""
    a1, c1 = info(A, 1, None), info(C, 1, None)
    catalog.commit_batch(ROOT, QUERY, 0, [a1, c1])
    a2 = info(A, 2, a1.checkpoint_id, lineage=(a1.ref,))
    catalog.commit_batch(ROOT, QUERY, 1, [a2])
    a3 = info(A, 3, a2.checkpoint_id, lineage=(a2.ref,))
    c2 = info(C, 2, c1.checkpoint_id, lineage=(c1.ref,))
    catalog.commit_batch(ROOT, QUERY, 2, [a3, c2])

    assert catalog.committed_before(ROOT, QUERY, 2) == {A: a2.ref, C: c1.ref}
    assert catalog.committed_before(ROOT, QUERY, 3) == {A: a3.ref, C: c2.ref}
    assert catalog.committed_before(ROOT, "another query", 2) == {A: a3.ref, C: c2.ref}
    again = info(C, 2, c1.checkpoint_id, lineage=(c1.ref,))
    replay = [info(A, 3, a2.checkpoint_id, lineage=(a2.ref,)), again]
    catalog.commit_batch(ROOT, QUERY, 2, replay)
    assert catalog.latest_committed(ROOT) == {i.store: i.ref for i in replay}


def test_a_store_first_committed_in_a_batch_has_nothing_before_it(catalog: Catalog) -> None:
    """Store C is first opened in batch 1 (a variable declared then, or every store restarted
    from empty before it): before batch 1 it has nothing, not batch 1's own commit, which a
    replay of batch 1 would build on twice; before batch 2 it has that commit."""
    a1 = info(A, 1, None)
    catalog.commit_batch(ROOT, QUERY, 0, [a1])
    a2, c1 = info(A, 2, a1.checkpoint_id, lineage=(a1.ref,)), info(C, 1, None)
    catalog.commit_batch(ROOT, QUERY, 1, [a2, c1])

    assert catalog.committed_before(ROOT, QUERY, 1) == {A: a1.ref}
    assert catalog.committed_before(ROOT, QUERY, 2) == {A: a2.ref, C: c1.ref}
    assert catalog.committed_before(ROOT, "another query", 1) == {A: a2.ref, C: c1.ref}


def test_a_replay_builds_on_the_version_another_query_committed(catalog: Catalog) -> None:
    """Query q2's batch 0 builds on q1's version 2 of store A and commits version 3: a replay
    of that batch builds on version 2 again, not on nothing (a commit of version 1 that the
    catalog refuses against the batch's version 3 on every retry)."""
    a1 = info(A, 1, None)
    catalog.commit_batch(ROOT, "q1", 0, [a1])
    a2 = info(A, 2, a1.checkpoint_id, lineage=(a1.ref,))
    catalog.commit_batch(ROOT, "q1", 1, [a2])
    assert catalog.committed_before(ROOT, "q2", 0) == {A: a2.ref}
    a3 = info(A, 3, a2.checkpoint_id, lineage=(a2.ref, a1.ref))
    catalog.commit_batch(ROOT, "q2", 0, [a3])

    assert catalog.committed_before(ROOT, "q2", 0) == {A: a2.ref}
    assert catalog.committed_before(ROOT, "q2", 1) == {A: a3.ref}
    replayed = info(A, 3, a2.checkpoint_id, lineage=(a2.ref, a1.ref))
    catalog.commit_batch(ROOT, "q2", 0, [replayed])
    assert catalog.latest_committed(ROOT) == {A: replayed.ref}


def test_the_problem_census_moves_whatever_order_ids_commit_in(catalog: Catalog) -> None:
    """The failures sensor's census: on PostgreSQL a problem's id is taken when its
    transaction starts, so a lower id can commit after a higher one; a problem found with a
    lower id while another is resolved still moves the census."""
    Stream(catalog, [A]).commit()
    with catalog.engine.begin() as connection:
        (store_id,) = connection.execute(sa.select(stores.c.store_id)).one()
        for problem_id in (1, 5):
            connection.execute(
                sa.insert(store_problems).values(
                    problem_id=problem_id, store_id=store_id, problem="damaged",
                    detected_at=catalog.now(),
                )
            )  # fmt: skip
    before = catalog.problem_census()
    with catalog.engine.begin() as connection:
        connection.execute(
            sa.insert(store_problems).values(
                problem_id=3, store_id=store_id, problem="damaged", detected_at=catalog.now()
            )
        )
        connection.execute(
            sa.update(store_problems)
            .where(store_problems.c.problem_id == 1)
            .values(resolved_at=catalog.now(), resolution="repaired")
        )
    assert before == (2, 2) and catalog.problem_census() == (2, 3)


def test_recommitting_the_same_batch_is_a_no_op(catalog: Catalog) -> None:
    stream = Stream(catalog, [A, B])
    infos = stream.commit()
    result = catalog.commit_batch(ROOT, QUERY, 0, infos, replace=False)
    assert result.replaced == {} and result.orphaned_files == 0
    assert set(states(catalog).values()) == {FileState.COMMITTED}


def test_replace_false_refuses_a_different_commit(catalog: Catalog) -> None:
    stream = Stream(catalog, [A])
    stream.commit()
    with pytest.raises(CommitConflict, match="already committed"):
        catalog.commit_batch(ROOT, QUERY, 0, [info(A, 1, None)], replace=False)


def test_replay_must_cover_every_store_of_the_batch(catalog: Catalog) -> None:
    Stream(catalog, [A, B]).commit()
    with pytest.raises(CommitConflict, match="leaves out 1 store"):
        catalog.commit_batch(ROOT, QUERY, 0, [info(A, 1, None)])


def test_replay_refused_when_later_versions_exist(catalog: Catalog) -> None:
    stream = Stream(catalog, [A])
    stream.run(3)
    v1 = stream.committed[A][0]
    with pytest.raises(CommitConflict, match="version 3 is already committed on top"):
        catalog.commit_batch(ROOT, QUERY, 1, [info(A, 2, v1.checkpoint_id)])


def test_commit_log_stays_linear(catalog: Catalog) -> None:
    stream = Stream(catalog, [A])
    stream.run(2)
    stale = stream.committed[A][0]  # builds on version 1 instead of 2's chain
    with pytest.raises(CommitConflict, match="not the store's next version"):
        catalog.commit_batch(ROOT, QUERY, 2, [info(A, 4, "a" * 32)])
    with pytest.raises(CommitConflict, match="is committed as"):
        catalog.commit_batch(ROOT, QUERY, 2, [info(A, 3, stale.checkpoint_id)])
    with pytest.raises(CommitConflict, match="not the store's next version"):
        catalog.commit_batch(ROOT, "another-query", 0, [info(A, 2, stale.checkpoint_id)])
    assert catalog.latest_committed(ROOT)[A] == stream.committed[A][1].ref


def test_failed_commit_leaves_nothing_behind(catalog: Catalog) -> None:
    """The last store's checkpoint breaks linearity: no store of the batch is committed, and
    not even the files the commit recorded on its way remain."""
    stream = Stream(catalog, [A, B, C])
    stream.commit()
    before_files, before_log = count(catalog, checkpoint_files), count(catalog, commit_log)
    good = [stream.delta(A), stream.delta(B)]
    bad = info(C, 2, "f" * 32)
    with pytest.raises(CommitConflict):
        catalog.commit_batch(ROOT, QUERY, 1, [*good, bad])
    assert count(catalog, checkpoint_files) == before_files
    assert count(catalog, commit_log) == before_log
    assert catalog.committed_ids(ROOT, QUERY, 1) == {}
    assert catalog.latest_committed(ROOT)[A].version == 1


def test_bad_commit_arguments(catalog: Catalog) -> None:
    delta = info(A, 1, None)
    with pytest.raises(InvalidArgument, match="commits no store"):
        catalog.commit_batch(ROOT, QUERY, 0, [])
    with pytest.raises(InvalidArgument, match="twice"):
        catalog.commit_batch(ROOT, QUERY, 0, [delta, info(A, 1, None)])
    with pytest.raises(InvalidArgument, match="query id"):
        catalog.commit_batch(ROOT, "bad query; DROP TABLE stores", 0, [delta])
    with pytest.raises(InvalidArgument, match="batch id"):
        catalog.commit_batch(ROOT, QUERY, -1, [delta])
    with pytest.raises(InvalidArgument, match="checkpoint root"):
        catalog.commit_batch("", QUERY, 0, [delta])
    assert count(catalog, checkpoint_files) == 0


def test_snapshot_state_follows_the_commit_log(catalog: Catalog) -> None:
    stream = Stream(catalog, [A])
    stream.run(3)
    snap = stream.snapshot(A)
    uncommitted = info(A, 4, stream.committed[A][2].checkpoint_id, kind=FileKind.SNAPSHOT)
    catalog.record_snapshot(ROOT, uncommitted)
    found = states(catalog)
    assert found[snap.path] == FileState.COMMITTED
    assert found[uncommitted.path] == FileState.WRITTEN
    with pytest.raises(InvalidArgument, match="delta"):
        catalog.record_snapshot(ROOT, stream.committed[A][0])


def test_a_snapshot_written_again_at_a_deleted_path_replaces_its_record(
    catalog: Catalog,
) -> None:
    """A snapshot whose file was deleted (here: lost) and which the snapshot pass writes
    again (other bytes, same path): the new file is recorded, committed and verified, with
    no problem, and the deletion leaves the ledger (it names files that are gone), so the
    file can be deleted and written again. A record that is not deleted still refuses other
    bytes (the file is damaged)."""
    stream = Stream(catalog, [A])
    stream.run(2)
    first = stream.snapshot(A)
    run = catalog.start_run("validate", "test")
    assert catalog.record_lost(run, ROOT, [first.path], "gone") == 1
    again = replace(first, checksum="1" * 64, bytes_written=first.bytes_written + 1)
    assert catalog.record_snapshot(ROOT, again, verified=True) is None
    assert states(catalog)[first.path] == FileState.COMMITTED
    latest = catalog.retained_versions(ROOT, A)[0]
    assert [(f.path, f.checksum, f.verification) for f in latest.files] == [
        (first.path, again.checksum, Verification.VERIFIED)
    ]
    assert catalog.problems(root=ROOT) == []
    assert catalog.deletion_history(root=ROOT) == []
    assert catalog.record_lost(run, ROOT, [first.path], "gone again") == 1
    assert [d.reason for d in catalog.deletion_history(root=ROOT)] == ["lost: gone again"]
    other = replace(again, checksum="2" * 64)
    assert catalog.record_snapshot(ROOT, other, verified=True) is None
    other = replace(other, checksum="3" * 64)
    assert catalog.record_snapshot(ROOT, other, verified=True) is not None


def test_registered_schemas_and_empty_store(catalog: Catalog) -> None:
    catalog.register_store(ROOT, A, "k STRING", {"type": "struct", "fields": []})
    (record,) = catalog.stores()
    assert record.key.store == A and record.latest == EMPTY
    assert record.key_schema == "k STRING"
    assert record.value_schema == {"type": "struct", "fields": []}
    assert catalog.latest_committed(ROOT) == {}


def test_batch_metrics_replaced_on_replay(catalog: Catalog) -> None:
    first = BatchMetrics(100, 40, 1000, 2048, 12.5, 3, 1, {"partitions": 4})
    again = BatchMetrics(100, 40, 1000, 2050, 9.0, 4, 0)
    catalog.record_batch_metrics(ROOT, QUERY, 0, first)
    catalog.record_batch_metrics(ROOT, QUERY, 1, first)
    catalog.record_batch_metrics(ROOT, QUERY, 1, again)
    recorded = catalog.batch_metrics(ROOT, QUERY)
    assert [(r.batch_id, r.metrics) for r in recorded] == [(1, again), (0, first)]
    with pytest.raises(InvalidArgument, match="negative"):
        catalog.record_batch_metrics(ROOT, QUERY, 2, replace(first, rows_in=-1))


def test_database_constraints_refuse_wrong_states(catalog: Catalog) -> None:
    """Even SQL that bypasses the library cannot commit two ids for one batch and store,
    or record a delta without its base."""
    stream = Stream(catalog, [A])
    (first,) = stream.commit()
    with catalog.engine.connect() as connection:
        row = connection.execute(sa.select(commit_log)).one()._asdict()
        del row["commit_id"]
        with pytest.raises(sa.exc.IntegrityError):
            connection.execute(sa.insert(commit_log).values(**{**row, "checkpoint_id": "b" * 32}))
        connection.rollback()
        with pytest.raises(sa.exc.IntegrityError):
            connection.execute(
                sa.update(checkpoint_files).values(version=2, base_checkpoint_id=None)
            )
        connection.rollback()
        with pytest.raises(sa.exc.IntegrityError):
            connection.execute(sa.update(checkpoint_files).values(state="lost"))
        connection.rollback()
    assert catalog.committed_ids(ROOT, QUERY, 0) == {A: CheckpointRef(1, first.checkpoint_id)}


def test_only_a_restore_after_the_last_earlier_commit_restarted_a_batchs_base(
    catalog: Catalog,
) -> None:
    """Batch 2 of a query whose commit log has nothing of batch 1 starts from empty stores
    (``restarted_base``) only after a restore to batch 1 that ended after the query's last
    commit of an earlier batch (with a later restore elsewhere being the latest): an older
    restore to batch 1 restarted nothing batch 0's commit, made after it, left."""
    stream = Stream(catalog, [StoreId(0, 0)])
    runs = iter(range(1, 10))

    def restore(to_batch: int) -> None:
        parameters = {"root": stream.root, "query_id": stream.query, "to_batch": to_batch}
        catalog.finish_run(
            catalog.start_run(RunKind.RESTORE.value, "tests", parameters), "succeeded"
        )

    def restarted_base() -> bool:
        start = catalog.begin_batch(
            stream.root, stream.query, 2, f"r{next(runs)}", [(0, "default", 1)]
        )
        return start.restarted_base

    restore(1)
    stream.commit()  # batch 0, after the restore to batch 1
    restore(5)
    assert not restarted_base()
    restore(1)
    restore(5)
    assert restarted_base()
