"""Retained versions, needed files, deletable files and explain(), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, FileState, RetentionPolicy, Verdict
from state_runtime.catalog.records import StatusChange, StoreKey
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.errors import CatalogError, CommitConflict, MaintenanceRefused
from state_runtime.identity import StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo
from tests.catalog.factory import LONG_AGO, QUERY, ROOT, Stream, info
from tests.statements import executed, statements

A, B = StoreId(0, 0), StoreId(0, 1)
NOW = LONG_AGO + timedelta(days=2)
POLICY = RetentionPolicy(retain_versions=2, window=timedelta(hours=1))


def twelve_versions(catalog: Catalog) -> tuple[Stream, dict[str, CheckpointInfo]]:
    """Stores A and B, 12 committed versions each; A has snapshots at versions 5 and 10."""
    stream = Stream(catalog, [A, B])
    files: dict[str, CheckpointInfo] = {}
    for version in range(1, 13):
        for i in stream.commit():
            if i.store == A:
                files[f"d{version}"] = i
        if version in (5, 10):
            files[f"s{version}"] = stream.snapshot(A)
    return stream, files


def paths(files: dict[str, CheckpointInfo], *names: str) -> set[str]:
    return {files[name].path for name in names}


def assert_one_text_on_postgresql(catalog: Catalog, texts: list[set[str]]) -> None:
    """``texts``, the statement texts of a call on few ids and of one on many: the same on
    PostgreSQL (the ids one array parameter), different on SQLite (an IN list of each call's
    length)."""
    if catalog.engine.dialect.name == "postgresql":
        assert texts[0] == texts[1]
        assert any("= ANY (" in text for text in texts[0])
    else:
        assert texts[0] != texts[1]


def test_retained_versions_load_from_the_newest_snapshot(catalog: Catalog) -> None:
    _, files = twelve_versions(catalog)
    retained = catalog.retained_versions(ROOT, A)
    assert [r.ref for r in retained] == [files["d12"].ref, files["d11"].ref]
    assert [f.path for f in retained[0].files] == [files[n].path for n in ("s10", "d11", "d12")]
    assert [f.path for f in retained[1].files] == [files[n].path for n in ("s10", "d11")]
    assert all(r.complete for r in retained)

    deletable = catalog.deletable_files(POLICY, root=ROOT, store=A, now=NOW)
    assert {v.file.path for v in deletable} == paths(files, *(f"d{v}" for v in range(1, 11)), "s5")
    assert {v.verdict for v in deletable} == {Verdict.DELETABLE_SUPERSEDED}


def test_a_version_with_its_own_snapshot_needs_only_that(catalog: Catalog) -> None:
    _, files = twelve_versions(catalog)
    policy = RetentionPolicy(retain_versions=4, window=timedelta(0))
    retained = {
        r.ref.version: [f.path for f in r.files] for r in catalog.retained_versions(ROOT, A, 4)
    }
    assert retained[10] == [files["s10"].path]
    assert retained[9] == [files[n].path for n in ("s5", "d6", "d7", "d8", "d9")]
    deletable = {v.file.path for v in catalog.deletable_files(policy, root=ROOT, store=A, now=NOW)}
    assert deletable == paths(files, "d1", "d2", "d3", "d4", "d5", "d10")


def test_a_lost_snapshot_is_traced_through_its_delta(catalog: Catalog) -> None:
    """Seed 001, example 3: validation finds the presumed snapshot gone; the chain continues
    through the ancestor's own delta down to the previous snapshot, and cleanup keeps it."""
    _, files = twelve_versions(catalog)
    run = catalog.start_run("validate", "test")
    assert catalog.record_lost(run, ROOT, [files["s10"].path], "checksum mismatch") == 1
    assert catalog.record_lost(run, ROOT, [files["s10"].path], "checksum mismatch") == 0
    (newest, _) = catalog.retained_versions(ROOT, A)
    assert [f.path for f in newest.files] == [
        files[n].path for n in ("s5", "d6", "d7", "d8", "d9", "d10", "d11", "d12")
    ]
    assert newest.complete
    deletable = {v.file.path for v in catalog.deletable_files(POLICY, root=ROOT, store=A, now=NOW)}
    assert deletable == paths(files, "d1", "d2", "d3", "d4", "d5")
    lost = catalog.explain(ROOT, files["s10"].path, POLICY)
    assert lost.verdict is Verdict.DELETED and lost.reason.endswith("lost: checksum mismatch")
    with pytest.raises(CatalogError, match="untracked"):
        catalog.record_lost(run, ROOT, ["state/0/0/default/nothing.snapshot"], "missing")


def test_a_broken_chain_is_reported_incomplete(catalog: Catalog) -> None:
    _, files = twelve_versions(catalog)
    with catalog.engine.begin() as connection:
        connection.execute(
            sa.update(checkpoint_files)
            .where(checkpoint_files.c.path == files["d11"].path)
            .values(state=FileState.DELETED.value)
        )
    newest, older = catalog.retained_versions(ROOT, A)
    # What the loader reads before it hits the gap at version 11.
    assert [f.path for f in newest.files] == [files["d12"].path]
    assert older.files == ()
    assert not newest.complete and not older.complete
    # Cleanup still keeps the snapshot below the gap.
    assert files["s10"].path not in {
        v.file.path for v in catalog.deletable_files(POLICY, root=ROOT, store=A, now=NOW)
    }


def test_window_and_grace_protect_young_files(catalog: Catalog) -> None:
    stream, files = twelve_versions(catalog)
    young = stream.clock  # d12 was committed one minute before the clock
    policy = RetentionPolicy(window=timedelta(hours=1), orphan_grace=timedelta(hours=6))
    soon = young + timedelta(minutes=30)
    verdicts = {v.file.path: v.verdict for v in catalog.file_verdicts(policy, root=ROOT, now=soon)}
    assert verdicts[files["d1"].path] is Verdict.WITHIN_WINDOW
    assert verdicts[files["d12"].path] is Verdict.NEEDED
    later = young + timedelta(hours=2)
    verdicts = {v.file.path: v.verdict for v in catalog.file_verdicts(policy, root=ROOT, now=later)}
    assert verdicts[files["d1"].path] is Verdict.DELETABLE_SUPERSEDED

    in_flight = stream.delta(A)  # version 13, written, not committed
    stream.record([in_flight])
    replay = info(B, 12, stream.committed[B][10].checkpoint_id, created_at=young)
    catalog.commit_batch(ROOT, QUERY, 11, [stream.committed[A][11], replay])
    orphan = stream.committed[B][11]
    for now, expected in (
        (
            young + timedelta(hours=2),
            {in_flight.path: Verdict.IN_FLIGHT, orphan.path: Verdict.ORPHAN_IN_GRACE},
        ),
        (
            young + timedelta(hours=7),
            {in_flight.path: Verdict.DELETABLE_UNCOMMITTED, orphan.path: Verdict.DELETABLE_ORPHAN},
        ),
    ):
        judged = {v.file.path: v for v in catalog.file_verdicts(policy, root=ROOT, now=now)}
        assert {p: judged[p].verdict for p in expected} == expected
    assert "replaced by a re-commit of batch 11" in judged[orphan.path].reason


def test_explain_says_why(catalog: Catalog) -> None:
    _, files = twelve_versions(catalog)
    needed = catalog.explain(ROOT, files["s10"].path, POLICY, now=NOW)
    assert needed.verdict is Verdict.NEEDED and needed.needed_by == (11, 12)
    assert "versions 11..12" in needed.reason
    own = catalog.explain(ROOT, files["d12"].path, POLICY, now=NOW)
    assert own.needed_by == (12, 12) and "version 12" in own.reason
    old = catalog.explain(ROOT, files["d3"].path, POLICY, now=NOW)
    assert old.verdict is Verdict.DELETABLE_SUPERSEDED and old.verdict.deletable
    assert "not needed by the last 2 committed versions" in old.reason
    assert old.file is not None and old.file.version == 3
    unknown = catalog.explain(ROOT, "state/0/0/default/99_" + "a" * 32 + ".delta", POLICY)
    assert unknown.verdict is Verdict.UNTRACKED and unknown.file is None


def test_retention_floor_is_enforced() -> None:
    with pytest.raises(MaintenanceRefused, match="safety floor of 2"):
        RetentionPolicy(retain_versions=1)


def test_cleanup_claims_deletes_and_records_with_reasons(catalog: Catalog) -> None:
    stream, files = twelve_versions(catalog)
    run = catalog.start_run("cleanup", "test", {"retain_versions": 2})
    claimed = catalog.claim_deletions(run, POLICY, ROOT, [A], now=NOW)
    expected = paths(files, *(f"d{v}" for v in range(1, 11)), "s5")
    assert {v.file.path for v in claimed} == expected
    assert catalog.deletable_files(POLICY, root=ROOT, store=A, now=NOW) == []

    # A commit that newly names a claimed file is refused: its file is about to disappear.
    claimed_delta = files["d3"]
    with pytest.raises(CommitConflict, match="deleting or deleted"):
        catalog.commit_batch(ROOT, QUERY, 99, [claimed_delta])
    # Retrying the commit of the batch that committed it is a no-op (docs/catalog.md).
    again = catalog.commit_batch(ROOT, QUERY, 2, [claimed_delta, stream.committed[B][2]])
    assert (again.replaced, again.orphaned_files) == ({}, 0)

    # A crashed run's claims come back to the next run.
    rerun = catalog.start_run("cleanup", "test")
    again = catalog.claim_deletions(rerun, POLICY, ROOT, [A], now=NOW)
    assert {v.file.path for v in again} == expected
    assert {v.verdict for v in again} == {Verdict.DELETING}

    done = sorted(expected)
    assert catalog.record_deletions(rerun, ROOT, done) == len(done)
    assert catalog.record_deletions(rerun, ROOT, done) == 0  # idempotent on resume
    ledger = catalog.deletion_history(root=ROOT)
    assert sorted(d.path for d in ledger) == done
    assert all(d.run_id == rerun and d.reason.startswith("superseded") for d in ledger)
    gone = catalog.explain(ROOT, files["d3"].path, POLICY)
    assert gone.verdict is Verdict.DELETED and gone.deletion is not None
    assert gone.deletion.run_id == rerun
    with pytest.raises(CatalogError, match="not claimed"):
        catalog.record_deletions(rerun, ROOT, [files["d12"].path])
    with pytest.raises(CatalogError, match="untracked"):
        catalog.record_deletions(rerun, ROOT, ["state/0/0/default/nothing.delta"])
    # Everything retained still loads from live files.
    assert all(r.complete for r in catalog.retained_versions(ROOT, A))


def test_deletions_recorded_by_the_claims_file_ids_once(catalog: Catalog) -> None:
    """Cleanup records what it deleted by the ids its claim returned: each file once, the
    claim's reason in the ledger, and no id that is unclaimed or not of the root."""
    _, files = twelve_versions(catalog)
    run = catalog.start_run("cleanup", "test")
    claimed = catalog.claim_deletions(run, POLICY, ROOT, [A], now=NOW)
    ids = [v.file_id for v in claimed if v.file_id is not None]
    assert len(ids) == len(claimed) == 11
    first = ids[:4]
    assert catalog.record_deletions_by_id(run, ROOT, first) == 4
    assert catalog.record_deletions_by_id(run, ROOT, ids) == len(ids) - 4  # each once
    assert catalog.record_deletions(run, ROOT, [v.file.path for v in claimed]) == 0
    ledger = catalog.deletion_history(root=ROOT)
    assert sorted(d.path for d in ledger) == sorted(v.file.path for v in claimed)
    assert {d.reason for d in ledger} == {v.reason for v in claimed}
    kept = {v.file.path: v for v in catalog.file_verdicts(POLICY, root=ROOT, now=NOW)}
    needed = kept[files["d12"].path].file_id
    assert needed is not None
    with pytest.raises(CatalogError, match="not claimed"):
        catalog.record_deletions_by_id(run, ROOT, [needed])
    with pytest.raises(CatalogError, match="not of"):
        catalog.record_deletions_by_id(run, "file:///elsewhere", [needed])
    assert all(r.complete for r in catalog.retained_versions(ROOT, A))


def test_a_record_writes_its_ledger_from_the_update_on_postgresql(catalog: Catalog) -> None:
    """Recording deleted files writes each file row once and its ledger row from it: on
    PostgreSQL one statement a chunk (the ledger filled from the update's ``RETURNING``), on
    SQLite the ledger's ``INSERT ... SELECT`` and the update. Each file is recorded once."""
    stream = Stream(catalog, [A])
    stream.commit()
    stream.record([stream.delta(A) for _ in range(5)])  # attempts that lost
    run = catalog.start_run("cleanup", "test")
    policy = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))
    claimed = catalog.claim_deletions(run, policy, ROOT, [A], now=NOW)
    ids = [v.file_id for v in claimed if v.file_id is not None]

    def writes(_conn: object, text: str, _context: object) -> str | None:
        return text if text.lstrip().startswith(("INSERT", "UPDATE", "WITH")) else None

    with executed(catalog.engine, writes) as sent:
        assert catalog.record_deletions_by_id(run, ROOT, ids) == 5
    assert catalog.record_deletions_by_id(run, ROOT, ids) == 0
    if catalog.engine.dialect.name == "postgresql":
        [one] = [text for text in sent if "checkpoint_files" in text]
        assert "RETURNING" in one and "INSERT INTO deletion_ledger" in one
    else:
        assert sum("checkpoint_files" in text for text in sent) == 2
    ledger = catalog.deletion_history(root=ROOT)
    assert sorted(d.path for d in ledger) == sorted(v.file.path for v in claimed)
    assert {(d.run_id, d.reason) for d in ledger} == {(run, v.reason) for v in claimed}


def test_snapshot_candidates_count_committed_deltas(catalog: Catalog) -> None:
    twelve_versions(catalog)
    candidates = catalog.snapshot_candidates(5, root=ROOT)
    assert [
        (c.key.store, c.deltas_since_snapshot, c.last_snapshot_version) for c in candidates
    ] == [(B, 12, 0)]
    every = catalog.snapshot_candidates(2)
    assert [(c.key.store, c.deltas_since_snapshot) for c in every] == [(B, 12), (A, 2)]
    assert catalog.snapshot_candidates(1, root="/elsewhere") == []


def test_store_health_figures(catalog: Catalog) -> None:
    stream, files = twelve_versions(catalog)
    run = catalog.start_run("snapshot", "test")
    catalog.record_snapshot(ROOT, stream.snapshot(B), run_id=run)
    catalog.finish_run(run, "succeeded", {"snapshots": 1})
    stream.record([info(A, 12, files["d11"].checkpoint_id)])  # orphan attempt
    health = {h.key.store: h for h in catalog.store_health(POLICY, root=ROOT, now=NOW)}
    a, b = health[A], health[B]
    assert (a.latest.version, a.last_snapshot_version, a.deltas_since_snapshot) == (12, 10, 2)
    assert (b.last_snapshot_version, b.deltas_since_snapshot, b.versions_behind) == (12, 0, 0)
    assert a.live_files == 12 + 2 + 1 and a.live_bytes == 15 * 1000
    assert (a.orphan_files, a.orphan_bytes) == (1, 1000)
    assert (a.reclaimable_files, a.reclaimable_bytes) == (12, 12_000)  # d1..d10, s5, orphan
    # B's snapshot at 12 frees only d12: retained version 11 still loads through d1..d11.
    assert (b.reclaimable_files, b.live_files) == (1, 13)
    assert a.state_rows == 100
    assert a.last_committed_at is not None and a.commit_lag == NOW - a.last_committed_at
    assert (b.last_run_id, b.last_run_kind, b.last_run_outcome) == (run, "snapshot", "succeeded")
    assert a.last_run_id is None


def test_claim_and_record_statements_are_one_text_whatever_the_files(catalog: Catalog) -> None:
    """On PostgreSQL the claim's and the record's statements pass their file and store ids as
    one array parameter each: a claim of 3 files and one of 30 send the same statement texts
    (an IN list had a parameter a value, named, rendered and parsed each call); SQLite keeps
    its IN lists. Each claim still takes, and each record still records, only its files."""
    stream = Stream(catalog, [A, B])
    stream.commit()
    for store, orphans in ((A, 3), (B, 30)):
        stream.record([stream.delta(store) for _ in range(orphans)])  # attempts that lost
    run = catalog.start_run("cleanup", "test")
    policy = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))
    texts: list[set[str]] = []
    for store, orphans in ((A, 3), (B, 30)):
        with statements(catalog.engine) as sent:
            claimed = catalog.claim_deletions(run, policy, ROOT, [store], now=NOW)
            ids = [v.file_id for v in claimed if v.file_id is not None]
            assert len(ids) == orphans and {v.file.key.store for v in claimed} == {store}
            assert catalog.record_deletions_by_id(run, ROOT, ids) == orphans
        texts.append(set(sent))
    assert_one_text_on_postgresql(catalog, texts)


def test_page_statements_are_one_text_whatever_the_page(catalog: Catalog) -> None:
    """On PostgreSQL the retained versions a snapshot chunk reads, and the pages of health,
    snapshot candidates (with their recovery costs) and the cleanup plan, pass their store
    ids as one array parameter: 3 stores and 30 send the same statement texts (an expanding
    IN list had a parameter a store, named, rendered and parsed each call); SQLite keeps its
    IN lists. Each read still answers for its stores only."""
    stores = [StoreId(0, p) for p in range(30)]
    stream = Stream(catalog, stores)
    for _ in range(3):
        stream.commit()
    texts: list[set[str]] = []
    for size in (3, 30):
        with statements(catalog.engine) as sent:
            retained = catalog.retained_versions_of(ROOT, stores[:size])
            assert set(retained) == set(stores[:size])
            assert all(len(versions) == 2 for versions in retained.values())
            for page in catalog.health_pages(POLICY, root=ROOT, now=NOW, page_size=size):
                assert len(page) == size
            for candidates in catalog.snapshot_candidate_pages(1, root=ROOT, page_size=size):
                assert len(candidates) == size
            for files in catalog.deletable_pages(POLICY, root=ROOT, now=NOW, page_size=size):
                assert files is not None
        texts.append(set(sent))
    assert_one_text_on_postgresql(catalog, texts)


def test_status_changes_read_the_last_ones_in_one_text_whatever_their_stores(
    catalog: Catalog,
) -> None:
    """Recording status changes reads each store's last recorded status by store id: on
    PostgreSQL one array parameter (it had been an IN list of their number), so changes of 3
    stores and of 30 send the same texts but the insert of the new rows (which the driver
    batches into one VALUES list); SQLite keeps its IN lists."""
    stores = [StoreId(0, p) for p in range(30)]
    Stream(catalog, stores).commit()
    texts: list[set[str]] = []
    for size in (3, 30):
        keys = [StoreKey(ROOT, store) for store in stores[:size]]
        changes = [StatusChange(key, "healthy", "test", None) for key in keys]
        with statements(catalog.engine) as sent:
            since = catalog.record_statuses(changes)
        assert set(since) == set(keys)
        texts.append({text for text in sent if not text.startswith("INSERT")})
    assert_one_text_on_postgresql(catalog, texts)


def test_a_claim_reads_its_own_stores_files_not_the_catalogs(sqlite_catalog_url: str) -> None:
    """A claim's work follows its stores' files, not the catalog's: with 50 times more files
    in other stores, claiming a store of 20 orphans costs about what it did alone (SQLite's
    virtual machine steps). The needed snapshots' subquery once read the live index of every
    store (no statistics: the planner drove the join from it), so a 1,000-file claim of a
    5,000,000-file backlog took 25 s under the write lock, and the pass's workers waiting on
    it exhausted their 'database is locked' retries."""
    catalog = Catalog.open(sqlite_catalog_url, upgrade=True)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # go on

    catalog.engine.dispose()  # every connection from here counts its steps
    sa.event.listen(
        catalog.engine, "connect", lambda dbapi, _: dbapi.set_progress_handler(count, 100)
    )

    def orphans(stream: Stream, each: int) -> None:
        for _ in range(each):
            stream.record([stream.delta(s, size=0) for s in stream.stores])

    def claim(store: StoreId) -> tuple[int, int]:
        run = catalog.start_run("cleanup", "test")
        steps[0] = 0
        claimed = catalog.claim_deletions(run, POLICY, ROOT, [store], now=NOW)
        return len(claimed), steps[0]

    orphans(Stream(catalog, [A, B]), 20)
    alone = claim(A)
    orphans(Stream(catalog, [StoreId(1, p) for p in range(100)], root="file:///other"), 20)
    among_others = claim(B)
    assert alone[0] == among_others[0] == 20
    assert among_others[1] < 1.5 * alone[1], (alone, among_others)
    catalog.close()
