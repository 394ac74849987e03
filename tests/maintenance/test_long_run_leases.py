"""A restore or a repartition that outlasts its leases' time to live keeps them (its run's
heartbeat renews them), so that no other maintenance run takes its stores meanwhile; one whose
leases ran out anyway stops before its switch with MaintenanceRefused. Real delays, a real
second run, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from state_runtime.catalog import Catalog, Lease, RunKind, StoreKey
from state_runtime.errors import CatalogUnavailable, MaintenanceRefused
from state_runtime.maintenance import Fleet, MaintenancePolicy, plan_restore, restore_query
from state_runtime.maintenance import repartition as repartition_module
from state_runtime.maintenance import restore as restore_module
from state_runtime.maintenance.repartition import repartition
from state_runtime.maintenance.runs import recorded_run
from tests.maintenance.streams import StoreStream
from tests.simulation.platform import QUERY, Platform

TTL = timedelta(seconds=1)  # the shortest a policy allows
SLOW = 2.5  # seconds: the slowed step outlasts two lease lifetimes
POLICY = MaintenancePolicy(lease_ttl=TTL)


def intrude(catalog: Catalog, keys: list[StoreKey]) -> list[StoreKey]:
    """A second maintenance run (another owner) asks for ``keys``' leases; the stores it got."""
    with recorded_run(
        catalog, RunKind.CLEANUP, "intruder", {}, None, leases=keys, lease_ttl=TTL
    ) as run:
        assert run.held is not None
        return run.held.keys


def slowed(step: Callable[..., Any], then: Callable[[], None]) -> Callable[..., Any]:
    """``step``, run after ``SLOW`` seconds and ``then`` (a large store's time, for real)."""

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW)
        then()
        return step(*args, **kwargs)

    return slow


def test_a_restore_longer_than_its_leases_keeps_them(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the restore's bases takes 2.5 lease lifetimes; a run started meanwhile gets
    none of its stores (before the fix it got them all), and the restore succeeds."""
    stream = make_stream()
    stream.run(6)
    keys = [stream.key(s) for s in stream.stores]
    taken: list[StoreKey] = []
    write = slowed(restore_module.write_bases, lambda: taken.extend(intrude(stream.catalog, keys)))
    monkeypatch.setattr(restore_module, "write_bases", write)
    fleet = Fleet(stream.catalog, owner="tests")
    planned = plan_restore(fleet, stream.root, stream.query, 3, spark_checkpoint="")
    plan = restore_query(fleet, planned, POLICY)
    assert taken == []
    assert plan.executed
    assert {r.version for r in stream.catalog.latest_committed(stream.root).values()} == {4}


def test_a_restore_whose_leases_ran_out_stops_before_its_switch(
    make_stream: Callable[..., StoreStream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog refuses every renewal while the bases are written (as if unreachable):
    the leases run out, another run takes the stores, and the restore, whose check before
    the switch finds them gone, fails with MaintenanceRefused, its switch not done."""
    stream = make_stream()
    stream.run(6)
    keys = [stream.key(s) for s in stream.stores]
    renew = stream.catalog.renew_leases
    down = [False]

    def flaky(leases: list[Lease], ttl: timedelta) -> list[Lease | None]:
        if down[0]:
            raise CatalogUnavailable("the catalog is unreachable")
        return renew(leases, ttl)

    def unreachable(step: Callable[..., Any]) -> Callable[..., Any]:
        def step_while_down(*args: Any, **kwargs: Any) -> Any:
            down[0] = True
            try:
                return step(*args, **kwargs)
            finally:
                down[0] = False

        return step_while_down

    taken: list[StoreKey] = []
    monkeypatch.setattr(stream.catalog, "renew_leases", flaky)
    write = slowed(restore_module.write_bases, lambda: taken.extend(intrude(stream.catalog, keys)))
    monkeypatch.setattr(restore_module, "write_bases", unreachable(write))
    fleet = Fleet(stream.catalog, owner="tests")
    plan = plan_restore(fleet, stream.root, stream.query, 3, spark_checkpoint="")
    with pytest.raises(MaintenanceRefused, match="ran out and passed to another maintenance run"):
        restore_query(fleet, plan, POLICY)
    assert sorted(taken, key=str) == sorted(keys, key=str)
    assert not plan.executed
    assert {r.version for r in stream.catalog.latest_committed(stream.root).values()} == {6}
    run = stream.catalog.run(plan.run_id or 0)
    assert run is not None and run.outcome == "failed"


def test_a_repartition_longer_than_its_leases_keeps_them(
    tmp_path: Path, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the new partitions takes 2.5 lease lifetimes; a run started meanwhile gets
    none of the old or new stores (before the fix it got them all), and the switch is made."""
    platform = Platform(tmp_path / "platform", partitions=2, catalog_url=catalog.url)
    try:
        for batch in range(3):
            changes = {p: {f"k{i}": batch for i in range(p, 40, 2)} for p in (0, 1)}
            platform.run_batch(batch, changes)
        taken: list[StoreKey] = []

        def intruder() -> None:
            keys = [r.key for r in catalog.stores(platform.root)]
            assert len(keys) == 4  # the two old partitions and the two new ones
            taken.extend(intrude(catalog, keys))

        write = slowed(repartition_module.write_partitions_locally, intruder)
        monkeypatch.setattr(repartition_module, "write_partitions_locally", write)
        plan = repartition(
            None,
            platform.fleet,
            platform.root,
            QUERY,
            4,
            operator_id=0,
            spark_checkpoint="",
            dry_run=False,
            policy=POLICY,
            idle=timedelta(0),
        )
        assert taken == []
        assert plan.executed and plan.switched["entries_added"] == 2  # partitions 2 and 3
    finally:
        platform.close()
