"""Passes use as many workers as the host and the catalog's connection pool allow, by default;
one setting (``STATE_MAINTENANCE_WORKERS``, ``--workers``, Dagster's and Airflow's ``workers``)
asks for another count, lowered to what the pool serves with a warning (and ``processes``,
declared alike, the worker processes: tests/maintenance/test_host_processes.py)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from state_runtime.catalog import Catalog
from state_runtime.cli import main
from state_runtime.maintenance import MaintenancePolicy
from state_runtime.maintenance import workers as workers_module
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.health import iter_store_reports
from state_runtime.maintenance.spark import TASK_WORKERS
from state_runtime.maintenance.workers import (
    RESERVED_CONNECTIONS,
    WORKERS_PER_CPU,
    closing_items,
    map_bounded,
    pool_allows,
    read_ahead,
    worker_count,
)


def test_the_default_is_several_workers_within_the_pool(catalog: Catalog) -> None:
    allowed = pool_allows(catalog)
    assert allowed == catalog.pool_capacity - RESERVED_CONNECTIONS > 1
    workers = worker_count(catalog, MaintenancePolicy())
    assert workers == min((os.cpu_count() or 1) * WORKERS_PER_CPU, allowed)
    assert 1 < workers <= allowed


def test_a_count_beyond_the_pool_is_lowered_with_a_warning(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    allowed = pool_allows(catalog)
    with caplog.at_level(logging.WARNING, logger="state_runtime.maintenance.workers"):
        assert worker_count(catalog, MaintenancePolicy(workers=allowed + 50)) == allowed
        assert worker_count(catalog, MaintenancePolicy(workers=allowed)) == allowed
        assert worker_count(catalog, MaintenancePolicy(workers=4), asked=2) == 2
    [warning] = caplog.messages
    assert f"{allowed + 50} workers asked (--workers or STATE_MAINTENANCE_WORKERS)" in warning
    assert f"serves {allowed} at once ({catalog.pool_capacity} connections" in warning


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"], indirect=True)
def test_a_spark_tasks_catalog_runs_two_workers_by_default(catalog: Catalog) -> None:
    """A Spark task opens its catalog with a pool for :data:`TASK_WORKERS` threads: a pass
    there defaults to them, and a larger ``workers`` is lowered to them."""
    url = catalog.engine.url.render_as_string(hide_password=False)
    with Catalog.open(url, connections=TASK_WORKERS + RESERVED_CONNECTIONS) as task:
        assert task.pool_capacity == TASK_WORKERS + RESERVED_CONNECTIONS
        assert worker_count(task, MaintenancePolicy()) == TASK_WORKERS
        assert worker_count(task, MaintenancePolicy(workers=8)) == TASK_WORKERS


def test_an_in_memory_catalog_is_worked_on_by_one_thread() -> None:
    """Each thread of an in-memory SQLite database would see its own empty database."""
    with Catalog.open("sqlite://", upgrade=True) as catalog:
        assert catalog.pool_capacity == 1
        assert worker_count(catalog, MaintenancePolicy()) == 1


def test_health_reads_an_in_memory_catalogs_pages_on_its_own_thread() -> None:
    """Health reads a page ahead on a thread only when the catalog's pool serves several: on
    another thread an in-memory catalog would be an empty database, its tables missing."""
    with Catalog.open("sqlite://", upgrade=True) as catalog:
        assert list(iter_store_reports(Fleet(catalog, owner="test"), MaintenancePolicy())) == []


@pytest.mark.parametrize("name", ["workers", "processes"])
def test_one_setting_for_the_cli_the_environment_dagster_and_airflow(name: str) -> None:
    variable = f"STATE_MAINTENANCE_{name.upper()}"
    assert getattr(MaintenancePolicy.from_env({variable: "3"}), name) == 3
    assert getattr(MaintenancePolicy.from_env({}), name) is None
    for command in ("maintain", "validate"):
        options = {p.name: p for p in main.commands[command].params}
        assert f"--{name}" in options[name].opts, command
    from dagster_project.defs.resources import MaintenanceResource

    assert getattr(MaintenanceResource().policy(), name) is None
    assert getattr(MaintenanceResource(**{name: 5}).policy(), name) == 5


def test_a_consumer_that_raises_cancels_the_queued_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """map_bounded keeps two items a worker queued; a pass whose consumer raises (a progress
    callback, a report) closes the map on leaving the block, so the queued item never runs,
    although the traceback still holds the generator. Items 1 and 2 hold both workers until
    the map shuts its pool down (after cancelling what was queued), whatever the load."""
    started: set[int] = set()
    shut_down = threading.Event()

    class Pool(ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            shut_down.set()
            super().shutdown(wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(workers_module, "ThreadPoolExecutor", Pool)

    def work(item: int) -> int:
        started.add(item)
        if item:
            shut_down.wait(timeout=60)  # bounded: a map left open must not hang the session
        return item

    done = map_bounded(work, range(10), 2, "test")
    with pytest.raises(RuntimeError), closing_items(done) as results:
        for _ in results:  # items 1 to 3 submitted: running or queued
            raise RuntimeError("the consumer failed")
    assert shut_down.is_set()  # the map was closed on leaving the block, its pool shut down
    # The queued item 3 never ran (nor will: no pool left); 1 or 2 may have been cancelled
    # too, if no worker had taken it yet.
    assert 0 in started and not started & {3, 4}, started


def test_read_ahead_reads_one_item_ahead_on_another_thread_in_order() -> None:
    """Each item is read on the read-ahead thread while the caller holds the one before: at
    most one ahead (memory of two pages), in order, and an error raised where it was read."""
    pulled: list[str] = []

    def pages() -> Iterator[int]:
        for page in range(4):
            pulled.append(threading.current_thread().name)
            yield page
        raise RuntimeError("page 4 failed")

    seen = []
    with pytest.raises(RuntimeError, match="page 4 failed"):
        for page in read_ahead(pages()):
            seen.append((page, len(pulled)))
    assert [p for p, _ in seen] == [0, 1, 2, 3]
    assert all(0 <= n - p - 1 <= 1 for p, n in seen)  # never more than one ahead
    assert all(name.startswith("read-ahead") for name in pulled)


def test_read_ahead_starts_no_thread_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call shares the process's read-ahead threads: once one served a call, the next
    calls start none (a thread a call cost as much CPU as a small catalog's health read)."""
    assert list(read_ahead(range(3))) == [0, 1, 2]
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(20):
        assert list(read_ahead(range(3))) == [0, 1, 2]
    assert not started, started


def test_a_reader_stopped_early_waits_for_its_read_ahead() -> None:
    """A caller that stops gets control back only once the read ahead of it finished, so the
    items are never read on two threads (closing them at once would raise "generator already
    executing")."""
    release = threading.Event()
    done: list[int] = []

    def pages() -> Iterator[int]:
        yield 0
        release.wait(5)
        done.append(1)
        yield 1

    items = pages()
    ahead = read_ahead(items)
    assert next(ahead) == 0
    threading.Timer(0.2, release.set).start()
    ahead.close()
    assert done == [1]
    items.close()


def test_read_ahead_works_in_a_forked_child() -> None:
    """A child forked after a read ahead ran has no copy of its threads: it starts its own."""
    assert list(read_ahead(range(2))) == [0, 1]
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its read ahead completes in time
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not a timeout plugin's handler
        signal.alarm(10)  # a read ahead on the parent's threads would wait forever
        code = 0 if list(read_ahead(range(2))) == [0, 1] else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
