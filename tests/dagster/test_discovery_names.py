"""Discovery follows the stores' names, not only their count: a store whose label changes
(another query committing below its root, its root relocated) gets its new partition, or the
failures sensor, naming it by the new label, would find no partition to fail
(docs/maintenance.md, *Partition keys a person can read*)."""

from __future__ import annotations

from collections.abc import Callable

from dagster import DagsterInstance, SensorResult, build_sensor_context

from dagster_project.defs.sensors import store_discovery_sensor
from state_runtime.maintenance import Fleet, run_checks
from tests.dagster.conftest import resources_for, store_name
from tests.dagster.test_dagster_definitions import FAST
from tests.dagster.test_store_failures import FailureSensor, break_store
from tests.maintenance.streams import StoreStream
from tests.orchestrator_catalog import BOTH_CATALOGS


class Discovery:
    """The discovery sensor's ticks, each one's partition requests applied to the instance."""

    def __init__(self, stream: StoreStream, instance: DagsterInstance) -> None:
        self.stream, self.instance, self.cursor = stream, instance, None

    def tick(self) -> SensorResult:
        resources = resources_for(self.stream.catalog, FAST)
        context = build_sensor_context(
            instance=self.instance, resources=resources, cursor=self.cursor
        )
        result = store_discovery_sensor(context)
        self.cursor = result.cursor
        for request in result.dynamic_partitions_requests:
            keys = list(request.partition_keys)
            if type(request).__name__ == "AddDynamicPartitionsRequest":
                self.instance.add_dynamic_partitions("state_stores", keys)
            else:
                for key in keys:
                    self.instance.delete_dynamic_partition("state_stores", key)
        return result

    def partitions(self) -> list[str]:
        return sorted(self.instance.get_dynamic_partitions("state_stores"))


def test_a_store_renamed_by_a_new_query_is_failed_under_its_new_name(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Six batches, discovery adds ``query-1/...``; the same root commits under a new query id
    (no store added: the count and newest id unchanged), so its label becomes the root's tail;
    a delta the latest versions need is deleted and checks run: discovery replaces the old
    partitions by the new names, and the failures tick requests the broken store's run."""
    stream = make_stream()
    stream.run(6)
    discovery = Discovery(stream, instance)
    discovery.tick()
    old = discovery.partitions()
    assert old == sorted(store_name(stream, s) for s in stream.stores)
    assert all(p.startswith(f"{stream.query}/") for p in old)

    stream.query = "query-2"  # the query restarted from the same checkpoint under a new id
    stream.run(1)
    new = sorted(store_name(stream, s) for s in stream.stores)
    assert not set(new) & set(old)
    broken = store_name(stream, stream.stores[1])
    break_store(stream)
    run_checks(Fleet(stream.catalog, owner="ops-laptop:4242"), FAST)

    renamed = discovery.tick()
    assert renamed.skip_reason is None
    assert discovery.partitions() == new  # the old ones deleted: their history stays
    assert FailureSensor(stream, instance).fail_broken() == [broken]
    quiet = discovery.tick()
    assert quiet.skip_reason is not None and quiet.cursor == renamed.cursor


def test_a_relocated_root_gets_its_partitions_under_the_new_label(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """Two roots of the same query are labelled by their tails: one relocated (no store added
    or removed), its partitions follow its new tail."""
    first, second = make_stream("a"), make_stream("b")
    for each in (first, second):
        each.run(2)
    discovery = Discovery(stream=first, instance=instance)
    discovery.tick()
    before = discovery.partitions()
    assert any(p.startswith(f"{first.query}@b/") for p in before)

    moved = f"{second.root.rstrip('/')}-moved"
    first.catalog.relocate_root(second.root, moved)
    assert discovery.tick().skip_reason is None
    after = discovery.partitions()
    assert any(p.startswith(f"{first.query}@b-moved/") for p in after)
    assert not any(p.startswith(f"{first.query}@b/") for p in after)
    assert len(after) == len(before)


@BOTH_CATALOGS
def test_a_query_moved_with_its_batches_restarted_gets_its_new_names(
    make_stream: Callable[..., StoreStream], instance: DagsterInstance
) -> None:
    """A query of six batches moves to a new checkpoint location: its stores there are
    registered (a tick names them by the new root's tail: no query committed there yet), then
    its batches restart from 0, below its old latest (5). The next tick gives both roots'
    stores their new names (``<query>@<tail>``): the mark follows the (root, query) pairs,
    where each query's latest batch (still 5, at the old root) missed the move until the new
    root's batches passed it."""
    old = make_stream()
    old.run(6)
    discovery = Discovery(old, instance)
    discovery.tick()
    moved = make_stream("moved")
    registered = discovery.tick()
    assert registered.skip_reason is None
    assert any(p.startswith("moved/") for p in discovery.partitions())

    moved.run(1)
    assert moved.batch == 1 < old.batch
    renamed = discovery.tick()
    assert renamed.skip_reason is None
    expected = sorted(store_name(s, store) for s in (old, moved) for store in s.stores)
    assert discovery.partitions() == expected
    assert all(p.startswith((f"{old.query}@checkpoint/", f"{old.query}@moved/")) for p in expected)
    quiet = discovery.tick()
    assert quiet.skip_reason is not None and quiet.cursor == renamed.cursor
