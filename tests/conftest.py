"""Shared fixtures. Service fixtures fail under CI when the service is missing."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from state_runtime.maintenance import StoreNames
from state_runtime.storage import LocalStorage, Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytest_plugins = ["tests.s3_fixtures"]

# tests/airflow runs in the Airflow environment (`make test-airflow`); the Dagster one has no
# Airflow to import.
collect_ignore = [] if importlib.util.find_spec("airflow") else ["airflow"]

# Hypothesis's too_slow check times data generation, so it fails on a loaded machine (CI runs
# two workers on two cores) without saying anything about the code under test. Loaded before
# any test module builds its settings, which inherit it unless they name their own checks.
settings.register_profile("state_runtime", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("state_runtime")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files holding a ``slow`` test first, the rest in collection order. ``make test``'s
    workers take whole files in this order (``--dist loadfile --no-loadscope-reorder``): the
    longest start first and the run ends on short ones, so neither worker idles long while the
    other finishes a long file (xdist's own order, most tests first, sent one-test files such
    as tests/dagster/test_fleet_events_memory.py last)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


BACKENDS = ["local", "s3"]
_BACKEND_MARKS = {"s3": pytest.mark.s3}


@pytest.fixture(autouse=True)
def forget_store_names() -> Iterator[None]:
    """Each test starts without the store names a previous one left in this process
    (``StoreNames.current`` keeps them by catalog URL, and PostgreSQL's test URL repeats)."""
    StoreNames.forget()
    yield
    StoreNames.forget()


@pytest.fixture(params=[pytest.param(b, marks=_BACKEND_MARKS.get(b, ())) for b in BACKENDS])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A fresh, empty checkpoint root on each storage backend (S3: a new bucket on moto)."""
    if request.param == "local":
        return LocalStorage(tmp_path / "checkpoint")
    if request.param == "s3":
        s3: Storage = request.getfixturevalue("s3_storage")
        return s3
    raise AssertionError(request.param)


@pytest.fixture(params=["memory", "disk"])
def state_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a store test twice: every run in memory, then a tiny budget that puts every run
    on local disk in blocks of a few rows (docs/state-on-disk.md)."""
    from tests.store_helpers import forced_disk

    if request.param == "memory":
        yield "memory"
        return
    with forced_disk():
        yield "disk"


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs that local files (runs, spilled input, spools) go to, for running
    out of local disk (needs the right to mount; skipped where there is none)."""
    from tests.store_helpers import local_tmpfs

    with local_tmpfs(tmp_path) as mount:
        yield mount


LOCAL_CLUSTER = "local-cluster[2,1,1024]"


def spark_master() -> str:
    """The test session's master: ``TEST_SPARK_MASTER``, else ``local[2,4]`` (two cores, a
    failed task tried up to 4 times, as ``spark.task.maxFailures`` does on a cluster, which
    local masters ignore). One JVM instead of ``local-cluster``'s three ran test files 1.3 to
    1.6 times as fast on the 2-core machine; the tests marked ``executors`` run in a pass of
    their own on ``LOCAL_CLUSTER``."""
    return os.environ.get("TEST_SPARK_MASTER", "local[2,4]")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``executors`` fails (never skips) on a session without two executor
    JVMs: what it checks would hold there without proving anything."""
    if item.get_closest_marker("executors") and spark_master() != LOCAL_CLUSTER:
        pytest.fail(f"needs two executor JVMs: run it with TEST_SPARK_MASTER={LOCAL_CLUSTER}")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One Spark session for the whole test run, on ``spark_master()``: one JVM whose two
    task threads share its Python workers, or (the ``executors`` pass) two real executor
    JVMs, so that state partitions really move between executors and their Python workers.

    With ``SPARK_REMOTE=local`` it is a Spark Connect client of a server this process starts
    (one per test session). pyspark picks its classic or Connect classes per process, so a
    test run is one kind or the other: ``make test`` runs the suites marked ``connect`` a
    second time that way."""
    from pyspark import cloudpickle

    import tests
    from state_runtime.runtime.spark_session import spark_session

    # Update functions defined in test modules travel by value: executors cannot import tests.
    cloudpickle.register_pickle_by_value(tests)

    # On a local master the tasks run in the driver's heap: 2g, as local-cluster's executors
    session = spark_session(
        spark_master(),
        app_name="state-runtime-tests",
        extra={
            "spark.task.maxFailures": "4",
            "spark.executor.memory": "1g",
            "spark.driver.memory": "2g",
        },
    )
    yield session
    session.stop()


@pytest.fixture
def sqlite_catalog_url(tmp_path: Path) -> str:
    """An embedded SQLite catalog in the test's own folder."""
    return f"sqlite:///{tmp_path / 'catalog.db'}"
