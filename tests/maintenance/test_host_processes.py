"""The passes dealt to worker processes on this host
(:class:`~state_runtime.maintenance.host_processes.HostProcesses`) give what they give in
threads; a process that raises fails the pass and its recorded run with its error, a process
lost fails them with WorkerProcessLost, a driver killed takes its processes along; processes
by default for a large pass on PostgreSQL, never in a daemonic process."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, RunKind
from state_runtime.errors import CatalogMisconfigured, CatalogUnavailable, WorkerProcessLost
from state_runtime.maintenance import (
    Fleet,
    cleanup,
    cleanup_pass,
    host_processes,
    run_checks,
    snapshot_pass,
)
from state_runtime.maintenance.host_processes import (
    CONNECTION_BUDGET,
    PROCESS_MIN_ITEMS,
    PROCESS_THREADS,
    HostProcesses,
    process_count,
    spread_for,
)
from state_runtime.maintenance.spread import Work
from state_runtime.maintenance.workers import RESERVED_CONNECTIONS
from tests.maintenance.spread_checks import (
    LATER,
    POLICY,
    THREADS,
    each_pass_alike,
    fleet_of,
)
from tests.maintenance.streams import StoreStream
from tests.simulation.postgres import PostgresCatalogs

POSTGRES = pytest.mark.parametrize("catalog", ["postgresql"], indirect=True)


def processes(catalog: Catalog, name: str = "test") -> HostProcesses:
    return HostProcesses(catalog.engine.url.render_as_string(hide_password=False), 2, name)


@POSTGRES
def test_each_pass_in_host_processes_as_in_threads(
    make_stream: Callable[..., StoreStream], catalog: Catalog
) -> None:
    each_pass_alike(make_stream, catalog, processes(catalog))


def _sabotaged(how: str, work: Work[Any, Any], fleet: Fleet, items: list[Any]) -> Iterable[Any]:
    """A worker process's slice that fails ``how``: raising our error, exiting, killed."""
    if how == "raise":
        raise CatalogUnavailable(f"catalog gone under {len(items)} items", store=items[0])
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
    return work(fleet, items)


@dataclass(frozen=True)
class Sabotaged:
    """:class:`HostProcesses` whose processes fail ``how`` on their slice."""

    inner: HostProcesses
    how: str

    def map(self, fleet: Fleet, items: Sequence[Any], work: Work[Any, Any]) -> Iterator[Any]:
        return self.inner.map(fleet, items, partial(_sabotaged, self.how, work))


PASSES: dict[str, Callable[[Fleet, Any], object]] = {
    "snapshot": lambda fleet, spread: snapshot_pass(fleet, POLICY, spread=spread),
    "validate": lambda fleet, spread: run_checks(fleet, POLICY, spread=spread),
    "cleanup": lambda fleet, spread: cleanup_pass(
        fleet, POLICY, now=LATER, dry_run=False, spread=spread
    ),
}


@POSTGRES
@pytest.mark.parametrize("kind", list(PASSES))
@pytest.mark.parametrize("how", ["raise", "exit", "kill"])
def test_a_failing_process_fails_the_pass_and_its_run(
    make_stream: Callable[..., StoreStream], catalog: Catalog, kind: str, how: str
) -> None:
    stream = make_stream()
    stream.run(6)
    if kind == "cleanup":  # deltas 1-4 become deletable
        snapshot_pass(fleet_of(stream), THREADS)
    spread = Sabotaged(processes(catalog, kind), how)
    if how == "raise":
        with pytest.raises(CatalogUnavailable, match="catalog gone under 1 items"):
            PASSES[kind](fleet_of(stream), spread)
    else:
        with pytest.raises(WorkerProcessLost, match=f"the {kind} pass lost one of its 2 worker"):
            PASSES[kind](fleet_of(stream), spread)
    [run] = [r for r in catalog.recent_runs() if r.kind == RunKind[kind.upper()].value]
    assert run.outcome == "failed"
    expected = "CatalogUnavailable: [" if how == "raise" else "WorkerProcessLost: ["
    assert run.error is not None and run.error.startswith(expected)


class Unreadable(Exception):
    """An error that pickles but does not unpickle (its ``__init__`` wants two arguments)."""

    def __init__(self, message: str, store: str) -> None:
        super().__init__(f"{message} ({store})")


def _unreadable(fleet: Fleet, items: list[Any]) -> Iterable[Any]:
    raise Unreadable("sent back unreadable", str(items[0]))


@POSTGRES
def test_what_the_driver_cannot_read_is_not_called_a_kill(catalog: Catalog) -> None:
    fleet = Fleet(catalog, owner="tests")
    read = "one of its 2 worker processes \\(it sent back what the driver could not read: TypeError"
    with pytest.raises(WorkerProcessLost, match=read):
        list(processes(catalog).map(fleet, [1, 2, 3], _unreadable))


@POSTGRES
def test_a_catalog_a_process_cannot_open_fails_the_pass_with_its_error(catalog: Catalog) -> None:
    """A process whose catalog does not open (gone, its connections exhausted) sends back the
    catalog's error, typed and naming the catalog, as its slice's: no process was lost."""
    url = catalog.engine.url.set(database="state_runtime_no_such_database")
    spread = HostProcesses(url.render_as_string(hide_password=False), 2, "snapshot")
    with pytest.raises(CatalogMisconfigured, match="state_runtime_no_such_database"):
        list(spread.map(Fleet(catalog, owner="tests"), [1, 2, 3], _unreadable))


def _killed_late(fleet: Fleet, items: list[int]) -> Iterable[int]:
    """The slice of item 0 kills its process after a second; the others return at once."""
    if 0 in items:
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    return items


@POSTGRES
def test_a_process_lost_while_the_driver_works_on_results(catalog: Catalog) -> None:
    """A process lost while the pass works on the results it has (the pool broken before
    the next slice is dealt) is WorkerProcessLost too, not the executor's own error."""
    fleet, spread = Fleet(catalog, owner="tests"), processes(catalog, "snapshot")
    results = spread.map(fleet, list(range(600)), _killed_late)  # 6 slices, 4 dealt at once
    next(results)
    time.sleep(3)  # the pass at work on a result: slice 0's process is killed meanwhile
    with pytest.raises(WorkerProcessLost, match="the snapshot pass lost one of its 2 worker"):
        list(results)


def test_processes_by_default_for_a_large_pass_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unasked: one process per CPU once each gets ``PROCESS_MIN_ITEMS`` items (a quiet 2-core
    host wrote 20,000 stores' snapshots 2.7 times faster in 2 processes than in one process's
    threads: docs/maintenance.md, "Passes on the host's processes"); threads for a small pass,
    on SQLite, or when 1 is asked."""
    monkeypatch.setattr(host_processes, "host_cpus", lambda: 4)
    assert process_count(None, "postgresql", 1_000_000) == 4
    assert process_count(None, "postgresql", 3 * PROCESS_MIN_ITEMS) == 3  # one per 250 items
    assert process_count(None, "postgresql", 2 * PROCESS_MIN_ITEMS - 1) == 1  # small: threads
    assert process_count(None, "sqlite", 1_000_000) == 1  # one writer: threads
    monkeypatch.setattr(host_processes, "host_cpus", lambda: 64)  # never past the budget
    allowed = CONNECTION_BUDGET // (PROCESS_THREADS + RESERVED_CONNECTIONS)
    assert process_count(None, "postgresql", 1_000_000) == allowed
    assert process_count(1, "postgresql", 1_000_000) == 1  # asked: threads only
    assert process_count(4, "sqlite", 10_000) == 1  # one writer: threads
    assert process_count(3, "postgresql", 10) == 3  # asked: even for a few items
    assert process_count(3, "postgresql", 2) == 2  # never more than the items
    assert process_count(3, "postgresql", 1) == 1


def _count_in_a_daemon(answer: Any, asked: int | None) -> None:
    answer.put(process_count(asked, "postgresql", 1_000_000))


@pytest.mark.parametrize("asked", [None, 4])
def test_a_daemonic_process_keeps_to_threads(
    asked: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor's daemonic worker (a multiprocessing pool's, some schedulers' task
    processes) may not start processes: its passes run in threads, asked or not."""
    monkeypatch.setattr(host_processes, "host_cpus", lambda: 4)  # the forked child's too
    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_count_in_a_daemon, args=(answer, asked), daemon=True)
    child.start()
    try:
        assert answer.get(timeout=60) == 1
    finally:
        child.join(30)
    assert process_count(asked, "postgresql", 1_000_000) == 4  # the same call, not a daemon


def test_processes_beyond_the_connection_budget_are_lowered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allowed = CONNECTION_BUDGET // (PROCESS_THREADS + RESERVED_CONNECTIONS)
    with caplog.at_level(logging.WARNING, logger="state_runtime.maintenance.host_processes"):
        assert process_count(256, "postgresql", 10_000) == allowed
        assert process_count(500, "postgresql", 10_000, threads=6) == CONNECTION_BUDGET // 8
    first, _ = caplog.messages
    assert "256 worker processes asked (--processes or STATE_MAINTENANCE_PROCESSES" in first
    assert f"{CONNECTION_BUDGET} catalog connections" in first


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"], indirect=True)
def test_the_passes_choice(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spread given wins; SQLite keeps to threads; PostgreSQL deals to processes when
    asked, and by default for a large pass, each with the pass's threads; the URL's password
    kept out of its repr."""
    monkeypatch.setattr(host_processes, "host_cpus", lambda: 2)
    fleet, given = Fleet(catalog, owner="tests"), processes(catalog)
    assert spread_for(fleet, POLICY, given, 10_000, "snapshot") is given
    asked = replace(POLICY, processes=2)
    chosen = spread_for(fleet, asked, None, 10_000, "snapshot", workers=3)
    if catalog.dialect == "sqlite":
        assert chosen is None
        return
    assert chosen == HostProcesses(given.catalog_url, 2, "snapshot", 3)
    assert spread_for(fleet, replace(POLICY, processes=1), None, 10_000, "snapshot") is None
    by_default = spread_for(fleet, POLICY, None, 1_000_000, "snapshot")
    assert by_default == HostProcesses(given.catalog_url, 2, "snapshot")
    assert spread_for(fleet, POLICY, None, PROCESS_MIN_ITEMS, "snapshot") is None
    assert "catalog_url" not in repr(chosen)
    unpicklable = Fleet(catalog, owner="tests", open_storage=lambda root: fleet.storage(root))
    assert spread_for(unpicklable, asked, None, 10_000, "snapshot") is None


def _hold(folder: str, fleet: Fleet, items: list[Any]) -> Iterable[Any]:
    """A worker process's slice that connects to the catalog, says its pid, and waits."""
    fleet.store_count()
    (Path(folder) / str(os.getpid())).touch()
    time.sleep(600)
    return items


_DRIVER = """
import sys
from functools import partial
from state_runtime.catalog import Catalog
from state_runtime.maintenance import Fleet
from state_runtime.maintenance.host_processes import HostProcesses
from tests.maintenance.test_host_processes import _hold
url, folder = sys.argv[1:]
fleet = Fleet(Catalog.open(url), owner="tests")
list(HostProcesses(url, 2, "test").map(fleet, list(range(4)), partial(_hold, folder)))
"""


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@POSTGRES
def test_a_driver_killed_takes_its_worker_processes_along(catalog: Catalog, tmp_path: Path) -> None:
    """A driver killed hard (SIGKILL, the OOM killer) never shuts its processes down: they
    end by themselves, their catalog connections (in a database of the test's own) closed."""
    databases = PostgresCatalogs()
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = :db AND application_name = 'state_runtime.catalog'"
    )

    def connections() -> int:
        with catalog.engine.connect() as connection:
            return int(connection.execute(query, {"db": databases.database}).scalar_one())

    workers: list[int] = []
    try:
        driver = subprocess.Popen([sys.executable, "-c", _DRIVER, databases(), str(tmp_path)])
        try:
            assert _until(lambda: len(list(tmp_path.iterdir())) == 2, 60), "no workers"
            workers = [int(p.name) for p in tmp_path.iterdir()]
            assert connections() >= 2  # the driver's and each worker's
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait()
        assert _until(lambda: all(_gone(pid) for pid in workers), 15), "workers orphaned"
        assert _until(lambda: connections() == 0, 15), "connections left behind"
    finally:
        for pid in workers:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        databases.close()


@POSTGRES
def test_cleanup_decides_by_its_chunks(
    make_stream: Callable[..., StoreStream], catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cleanup deals chunks, not stores: its stores in one chunk are cleaned in threads,
    however many processes were asked."""
    stream = make_stream()
    stream.run(6)
    snapshot_pass(fleet_of(stream), THREADS)
    counts: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        counts.append(args[3])
        return spread_for(*args, **kwargs)

    monkeypatch.setattr(cleanup, "spread_for", spy)
    report = cleanup_pass(fleet_of(stream), replace(POLICY, processes=2), now=LATER, dry_run=False)
    assert counts == [len(stream.stores), 1]
    assert report.deleted_files > 0
