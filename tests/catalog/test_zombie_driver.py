"""Two drivers, one batch: an old ("zombie") driver that began a batch before another took the
query over must not replace the newer driver's commit of that batch with its own late one.

Real drivers at library level (``tests/simulation/platform.py``: the runtime's registration,
``begin_batch``, the real task body on local files, ``commit_batch``), each with its own
query object and catalog connection, on SQLite and on PostgreSQL. Before the fix the zombie's
commit replaced the newer one (docs/catalog.md promised the later commit wins)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.tables import batch_intents
from state_runtime.errors import AttemptSuperseded
from state_runtime.identity import StoreId
from state_runtime.maintenance import sweep_attempts
from tests.catalog.conftest import DIALECTS
from tests.simulation.platform import Platform, Stage, policy


@pytest.fixture(params=DIALECTS)
def platform(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Platform]:
    url = ""
    if request.param != "sqlite":
        url = request.getfixturevalue("pg_schema")
        Catalog.open(url, upgrade=True).close()
    platform = Platform(tmp_path, catalog_url=url)
    platform.run_batch(0, {0: {"a": 1}, 1: {"b": 1}})
    yield platform
    platform.close()


def intents(platform: Platform) -> int:
    """The number of intents the catalog holds."""
    engine = sa.create_engine(platform.catalog_url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    sa.select(sa.func.count()).select_from(batch_intents)
                ).scalar_one()
            )
    finally:
        engine.dispose()


def state_of(platform: Platform, batch: int, partition: int) -> dict[str, tuple[object, ...]]:
    store = StoreId(0, partition)
    return platform.load(store, platform.committed_refs()[batch][store])


@pytest.mark.parametrize("at", ["begun", "written"])
def test_a_zombie_drivers_late_commit_is_refused(platform: Platform, at: Stage) -> None:
    """The zombie begins batch 1 (and perhaps writes its files); a new driver takes over and
    commits batch 1 with other input; the zombie's commit then raises AttemptSuperseded, and
    batch 1 stays the new driver's."""
    zombie = platform.spare_driver()

    def take_over(stage: Stage) -> None:
        if stage == at:
            platform.restart_driver()
            platform.run_batch(1, {0: {"a": 10}})

    try:
        with pytest.raises(AttemptSuperseded, match=r"batch 1 of query \S+: attempt \w+ is older"):
            platform.run_batch(1, {0: {"a": 100}}, driver=zombie, between=take_over)
    finally:
        zombie.catalog.close()
    assert state_of(platform, 1, 0) == {"a": (11,)}
    platform.run_batch(2, {1: {"b": 1}})  # the query goes on from the new driver's batch 1
    assert state_of(platform, 2, 0) == {"a": (11,)}


def test_the_order_is_the_databases_not_a_clock(platform: Platform) -> None:
    """The new driver's host clock is an hour behind the zombie's (a clock stepped back): its
    intent's start time is the earlier, yet its commit stands, and its own replay of the batch
    (a legitimate later attempt) commits."""
    zombie = platform.spare_driver()
    platform.restart_driver()
    platform.query.catalog.clock.wall = lambda: zombie.catalog.clock.wall() - 3600

    def take_over(stage: Stage) -> None:
        if stage == "written":
            platform.run_batch(1, {0: {"a": 10}})

    try:
        with pytest.raises(AttemptSuperseded):
            platform.run_batch(1, {0: {"a": 100}}, driver=zombie, between=take_over)
    finally:
        zombie.catalog.close()
    platform.run_batch(1, {0: {"a": 20}})  # the new driver replays batch 1
    assert state_of(platform, 1, 0) == {"a": (21,)}


def test_the_order_outlives_the_attempt_sweep(platform: Platform) -> None:
    """The attempt sweep forgets swept intents (here both drivers' of batch 1, an hour on),
    but keeps the query's newest: the zombie's commit, its own intent gone, is still refused."""
    zombie = platform.spare_driver()

    def take_over_and_sweep(stage: Stage) -> None:
        if stage == "written":
            platform.restart_driver()
            platform.run_batch(1, {0: {"a": 10}})
            later = platform.catalog.now() + timedelta(hours=1)
            for _ in range(2):  # the first marks the intents swept, the second forgets them
                sweep_attempts(platform.fleet, policy(True), dry_run=False, now=later)
            assert intents(platform) == 1  # the new driver's: the query's newest

    try:
        with pytest.raises(AttemptSuperseded):
            platform.run_batch(1, {0: {"a": 100}}, driver=zombie, between=take_over_and_sweep)
    finally:
        zombie.catalog.close()
    assert state_of(platform, 1, 0) == {"a": (11,)}
