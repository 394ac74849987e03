"""Real concurrent connections: drivers racing on one batch, cleanup racing a commit."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, FileState, RetentionPolicy
from state_runtime.catalog.schema.tables import checkpoint_files, commit_log
from state_runtime.catalog.sql import commits, deletions
from state_runtime.errors import CommitConflict
from state_runtime.identity import StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo
from tests.catalog.conftest import FAST_RETRY
from tests.catalog.factory import QUERY, ROOT, Stream

STORES = [StoreId(op, part) for op in range(2) for part in range(4)]
NO_WAIT = RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0))


@pytest.fixture
def drivers(catalog: Catalog) -> Iterator[tuple[Catalog, Catalog]]:
    """Two more clients of the same database, each with its own connection pool."""
    url = catalog.engine.url.render_as_string(hide_password=False)
    pair = (Catalog.open(url, retry=FAST_RETRY), Catalog.open(url, retry=FAST_RETRY))
    yield pair
    for client in pair:
        client.close()


def file_states(catalog: Catalog) -> dict[str, str]:
    with catalog.engine.connect() as connection:
        rows = connection.execute(sa.select(checkpoint_files.c.path, checkpoint_files.c.state))
        return {row.path: row.state for row in rows}


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at the same moment on their own threads; return results or exceptions."""
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(start, calls))


@pytest.mark.parametrize("replace", [True, False])
def test_two_drivers_commit_the_same_batch(
    catalog: Catalog, drivers: tuple[Catalog, Catalog], replace: bool
) -> None:
    stream = Stream(catalog, STORES)
    for batch in range(6):
        attempts = [[stream.delta(s) for s in STORES] for _ in drivers]
        for driver, attempt in zip(drivers, attempts, strict=True):
            driver.record_files(ROOT, attempt)  # the tasks report their files first
        results = race(
            *(
                lambda d=d, a=a, b=batch: d.commit_batch(ROOT, QUERY, b, a, replace=replace)
                for d, a in zip(drivers, attempts, strict=True)
            )
        )
        failed = [r for r in results if isinstance(r, Exception)]
        if replace:
            assert failed == []
        else:
            assert len(failed) == 1 and isinstance(failed[0], CommitConflict)
        committed = catalog.committed_ids(ROOT, QUERY, batch)
        winner = [a for a in attempts if committed == {i.store: i.ref for i in a}]
        assert len(winner) == 1, "the batch mixes both drivers' checkpoints"
        loser = attempts[1 - attempts.index(winner[0])]
        states = file_states(catalog)
        assert {states[i.path] for i in winner[0]} == {FileState.COMMITTED}
        assert {states[i.path] for i in loser} == {FileState.ORPHAN}
        for i in winner[0]:
            stream.committed.setdefault(i.store, []).append(i)
    with catalog.engine.connect() as connection:
        entries = connection.execute(sa.select(sa.func.count()).select_from(commit_log))
        assert entries.scalar() == 6 * len(STORES)


class Gate:
    """Pauses the first thread that reaches a patched step until the test opens the gate."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.open = threading.Event()
        self.used = False

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def paused(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if not self.used:
                self.used = True
                self.reached.set()
                assert self.open.wait(10)
            return result

        return paused


def _store_with_old_attempt(catalog: Catalog) -> tuple[Stream, CheckpointInfo]:
    """A store with 3 committed versions and an old, uncommitted attempt at version 4 (a
    driver that died long ago, now replaying): cleanup deems it deletable."""
    stream = Stream(catalog, STORES[:1])
    stream.run(3)
    attempt = stream.delta(STORES[0])
    catalog.record_files(ROOT, [attempt])
    # Written and recorded an hour ago: at zero grace, a file stamped this instant is old
    # only if every client's estimate of the database's clock agrees to the millisecond,
    # which two clients under load need not (each reads it within a round trip).
    f = checkpoint_files.c
    with catalog.engine.begin() as connection:
        created, recorded = connection.execute(
            sa.select(f.created_at, f.recorded_at).where(f.path == attempt.path)
        ).one()
        connection.execute(
            sa.update(checkpoint_files)
            .where(f.path == attempt.path)
            .values(
                created_at=created - timedelta(hours=1), recorded_at=recorded - timedelta(hours=1)
            )
        )
    return stream, attempt


def test_cleanup_waits_for_a_commit_in_progress(
    catalog: Catalog, drivers: tuple[Catalog, Catalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit holds the store lock: cleanup waits, then sees the file as needed."""
    driver, cleaner = drivers
    _, attempt = _store_with_old_attempt(catalog)
    gate = Gate()
    monkeypatch.setattr(commits, "_apply", gate.wrap(commits._apply))
    run = cleaner.start_run("cleanup", "race")
    with ThreadPoolExecutor(2) as pool:
        committing = pool.submit(driver.commit_batch, ROOT, QUERY, 3, [attempt])
        assert gate.reached.wait(10)
        cleaning = pool.submit(cleaner.claim_deletions, run, NO_WAIT, ROOT)
        with pytest.raises(TimeoutError):
            cleaning.result(timeout=0.5)  # blocked on the commit's lock
        gate.open.set()
        committing.result(timeout=10)
        claimed = cleaning.result(timeout=10)
    assert attempt.path not in {v.file.path for v in claimed}
    assert file_states(catalog)[attempt.path] == FileState.COMMITTED
    assert all(r.complete for r in catalog.retained_versions(ROOT, STORES[0]))


def test_a_commit_waits_for_cleanup_and_refuses_a_claimed_file(
    catalog: Catalog, drivers: tuple[Catalog, Catalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cleanup holds the store lock and claims the old attempt: the commit waits, then fails
    cleanly instead of committing a file about to be deleted."""
    driver, cleaner = drivers
    stream, attempt = _store_with_old_attempt(catalog)
    gate = Gate()
    monkeypatch.setattr(deletions, "verdict_rows", gate.wrap(deletions.verdict_rows))
    run = cleaner.start_run("cleanup", "race")
    with ThreadPoolExecutor(2) as pool:
        cleaning = pool.submit(cleaner.claim_deletions, run, NO_WAIT, ROOT)
        assert gate.reached.wait(10)
        committing = pool.submit(driver.commit_batch, ROOT, QUERY, 3, [attempt])
        with pytest.raises(TimeoutError):
            committing.result(timeout=0.5)
        gate.open.set()
        claimed = cleaning.result(timeout=10)
        with pytest.raises(CommitConflict, match="deleting or deleted"):
            committing.result(timeout=10)
    assert attempt.path in {v.file.path for v in claimed}
    assert catalog.latest_committed(ROOT)[STORES[0]] == stream.committed[STORES[0]][-1].ref


@pytest.mark.postgres
def test_cleanup_racing_a_stream_never_loses_a_needed_file(pg_catalog: Catalog) -> None:
    """A stream records files (tasks), then commits (driver); cleanup with no window or
    grace runs in a loop beside it and deletes all it may. A commit whose file was claimed
    in between fails and is replayed with a fresh attempt, as the runtime does. Afterwards
    no committed entry names a deleted file and every retained version loads."""
    url = pg_catalog.engine.url.render_as_string(hide_password=False)
    driver, cleaner = (Catalog.open(url, retry=FAST_RETRY) for _ in range(2))
    stores = STORES[:4]
    stream = Stream(driver, stores)
    stop = threading.Event()
    conflicts = 0
    claimed_total = 0

    def clean() -> None:
        nonlocal claimed_total
        while not stop.is_set():
            run = cleaner.start_run("cleanup", "stress")
            claimed = cleaner.claim_deletions(run, NO_WAIT, ROOT)
            cleaner.record_deletions(run, ROOT, [v.file.path for v in claimed])
            cleaner.finish_run(run, "succeeded", {"deleted": len(claimed)})
            claimed_total += len(claimed)
            stop.wait(random.uniform(0, 0.01))

    with ThreadPoolExecutor(1) as pool:
        cleaning = pool.submit(clean)
        for batch in range(15):
            while True:
                attempt = [stream.delta(s) for s in stores]
                driver.record_files(ROOT, attempt)
                if random.random() < 0.5:
                    driver.record_files(ROOT, [stream.delta(s) for s in stores])  # duplicates
                try:
                    driver.commit_batch(ROOT, QUERY, batch, attempt)
                    break
                except CommitConflict:
                    conflicts += 1
            for i in attempt:
                stream.committed.setdefault(i.store, []).append(i)
            if batch % 5 == 4:
                for s in stores:
                    stream.snapshot(s)
        stop.set()
        cleaning.result(timeout=30)

    # A committed delta may go once a snapshot supersedes it, but never for another reason:
    # "never committed" or "orphan" on a committed file would mean the race was lost.
    with pg_catalog.engine.connect() as connection:
        c, f = commit_log.c, checkpoint_files.c
        reasons = connection.execute(
            sa.select(f.state_reason)
            .select_from(commit_log)
            .join(checkpoint_files, f.file_id == c.file_id)
            .where(f.state.in_(["deleting", "deleted"]))
        ).scalars()
        assert {str(reason).split(":")[0] for reason in reasons} <= {"superseded"}
    for s in stores:
        retained = pg_catalog.retained_versions(ROOT, s)
        assert [r.ref.version for r in retained] == [15, 14]
        assert all(r.complete for r in retained), retained
    assert claimed_total > 0
    driver.close()
    cleaner.close()
    print(f"commit conflicts resolved by replay: {conflicts}; files deleted: {claimed_total}")
