"""A fleet-wide pass's memory does not grow with the fleet (issue 35): validation, the cleanup
plan, health and the snapshots due read the catalog a page of stores at a time and keep
counters plus the first few findings, files or stores.

Measured in-process with tracemalloc (Python allocations only: the page's rows, the records,
the report), not RSS, which the allocator and the machine's load make noisy. The fleets are
2,000 and 20,000 stores (10 and 100 queries of 200 partitions in one catalog, built once for
the module: tests/maintenance/fleet_copies.py), each store with three committed versions, every file
verified and present (empty), and two deletable orphans. Building a page's statements
leaves reference cycles that Python's oldest generation collects only now and then (its
threshold grows with the heap, not the fleet), so the test collects after every catalog
read: the peak is then what a pass holds. Each pass runs once on the small fleet first (the
engine's compiled statements, imports), then is measured on each. The objects alive before a
measurement are frozen (``gc.freeze``), so those collections traverse only what the pass
allocated (the cycles they are for): traversing the process's whole heap (Spark, Dagster,
pytest) after each of ~200 reads took most of this module's minutes.

Holding the whole result (the code before), health and the cleanup plan peaked 3.0x and
3.4x higher at 5,000 stores than at 1,000 (this test's earlier form); validation held a
result per store and the snapshots due every store's record, both growing with the fleet.
The validation's checks (``run_checks``) held every store's health report in its
``ChecksReport`` and the retention check an entry per store with an overdue file: 1.9 and
8.0 MB at 400 and 4,000 stores (4.2x); with the reports on disk a page at a time
(``HealthSpool``) and the retention check reading the plan a page at a time (keeping the
first 1,000 findings), 1.7 and 2.9 MB (1.7x; 3.6 MB, 2.2x, with the first change alone).
The bound, 2x at 10x the stores, leaves room for noise and is far below that growth.
Validation also peaked ~5x higher on the large fleet when pathlib, parsing each row's root
and each store's folder, churned the interpreter's table of interned strings until it
resized (3.7 MB); roots are now resolved once and listings use strings. The fleets were 400
and 4,000 stores until issue 35's sizes were taken (the figures above are theirs); at 2,000
and 20,000 the module took 107 s on a quiet 2-core machine.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest

from state_runtime.catalog import Catalog, StoreKey
from state_runtime.catalog.sql.rows import store_id, store_key
from state_runtime.identity import StoreId
from state_runtime.maintenance import (
    Fleet,
    FleetTotals,
    MaintenancePolicy,
    cleanup_pass,
    due_for_snapshot,
    iter_store_reports,
    run_checks,
    store_reports,
    validate_stores,
)
from tests.catalog.factory import Stream
from tests.maintenance.fleet_copies import PARTITIONS, fleet_of

pytestmark = pytest.mark.slow
T = TypeVar("T")
SMALL, LARGE = 2_000, 20_000
RATIO = 2.0
POLICY = MaintenancePolicy(verify_sample_percent=0, snapshot_min_deltas=2, snapshots_per_run=50)
"""Validation reads no file (each is checked present by its store's listing); every store is
due for a snapshot, the pass takes 50."""
NOW = datetime.now(UTC) + timedelta(days=30)  # every orphan is past the retention window


def _collecting(catalog: Catalog) -> Catalog:
    """``catalog``, collecting garbage after every read (module docstring)."""
    read = catalog._read

    def collected(what: str, work: Callable[..., T]) -> T:
        try:
            return read(what, work)
        finally:
            gc.collect()

    catalog._read = collected  # type: ignore[method-assign]
    return catalog


def built_fleets(folder: Path, small: int, large: int) -> Iterator[tuple[Fleet, Fleet]]:
    """A fleet of ``small`` stores and one of ``large``: the first queries of one catalog's,
    and all (one engine: its statements, compiled once, are shared by both)."""
    catalog = Catalog.open(f"sqlite:///{folder}/catalog.db", upgrade=True)
    roots = fleet_of(catalog, folder, large // PARTITIONS)
    _collecting(catalog)
    _freeze()
    try:
        yield (
            Fleet(catalog, roots=roots[: small // PARTITIONS], owner="tests"),
            Fleet(catalog, roots=roots, owner="tests"),
        )
    finally:
        gc.unfreeze()
        catalog.close()


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Fleet]]:
    """The small fleet and the large one (:data:`SMALL`, :data:`LARGE`)."""
    yield from built_fleets(tmp_path_factory.mktemp("fleet"), SMALL, LARGE)


def _freeze() -> None:
    """Collect, then leave every object alive out of later collections (module docstring):
    they then traverse only the objects allocated since."""
    gc.collect()
    gc.freeze()


def _peak(work: Callable[[Fleet], object], fleet: Fleet) -> tuple[int, object]:
    """The pass's peak, its cache of store keys filled from empty (it is bounded: a fleet
    larger than it churns through it, one smaller fills part of it)."""
    store_key.cache_clear()
    store_id.cache_clear()
    _freeze()
    tracemalloc.start()
    try:
        result = work(fleet)
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


PASSES: dict[str, tuple[Callable[[Fleet], object], Callable[[object, int], bool]]] = {
    "validation": (
        lambda f: validate_stores(f, POLICY, workers=2).counts(),
        lambda counts, n: counts == counts | {"stores": n, "files_present": 3 * n, "errors": 0},
    ),
    "snapshots due": (
        lambda f: len(due_for_snapshot(f, POLICY)),
        lambda due, n: due == POLICY.snapshots_per_run,
    ),
    "health": (
        lambda f: FleetTotals.of(iter_store_reports(f, POLICY, now=NOW)).stores,
        lambda stores, n: stores == n,
    ),
    "validation's checks": (
        lambda f: len(run_checks(f, POLICY, now=NOW).health),
        lambda stores, n: stores == n,
    ),
    "cleanup plan": (
        lambda f: cleanup_pass(f, POLICY, now=NOW).planned_files,
        lambda planned, n: planned == 2 * n,
    ),
}


@pytest.mark.parametrize("name", PASSES)
def test_a_pass_stays_flat_from_2000_to_20000_stores(
    fleets: tuple[Fleet, Fleet], name: str
) -> None:
    work, expected = PASSES[name]
    work(fleets[0])  # warm: the engine's compiled statements, imports
    peaks = []
    for fleet, stores in zip(fleets, (SMALL, LARGE), strict=True):
        peak, result = _peak(work, fleet)
        assert expected(result, stores), f"{name} at {stores} stores: {result}"
        peaks.append(peak)
    print(f"{name}: peak {peaks} bytes at {SMALL}/{LARGE} stores")
    assert peaks[1] < RATIO * peaks[0], f"{name}: peak {peaks} bytes at {SMALL}/{LARGE}"


def _stream_fleet(tmp_path: Path, stores: int) -> Fleet:
    """``stores`` stores with 3 committed versions and 2 orphan files each."""
    catalog = Catalog.open(f"sqlite:///{tmp_path}/catalog-{stores}.db", upgrade=True)
    root = tmp_path / f"root-{stores}"
    root.mkdir()
    stream = Stream(
        catalog, [StoreId(0, p) for p in range(stores)], root=str(root), writers_behind=None
    )
    for _ in range(2):
        stream.record([stream.delta(s) for s in stream.stores])  # an attempt that lost
        stream.commit()
    stream.commit()
    return Fleet(catalog, owner="tests")


class _CountedKeys(list[StoreKey]):
    """A list that counts membership tests: a pass must look stores up in a set it builds
    once, never in the caller's collection (20,000 x 20,000 comparisons at fleet size)."""

    lookups = 0

    def __contains__(self, key: object) -> bool:
        _CountedKeys.lookups += 1
        return super().__contains__(key)


@pytest.mark.parametrize("pass_", ["health", "cleanup"])
def test_a_pass_naming_stores_looks_them_up_in_a_set(tmp_path: Path, pass_: str) -> None:
    fleet = _stream_fleet(tmp_path, 20)
    try:
        only = _CountedKeys(r.key for r in fleet.stores()[:10])
        _CountedKeys.lookups = 0
        if pass_ == "health":
            assert len(store_reports(fleet, POLICY, only=only, now=NOW)) == 10
        else:
            assert cleanup_pass(fleet, POLICY, only=only, now=NOW).planned_files == 20
        assert _CountedKeys.lookups == 0
    finally:
        fleet.catalog.close()
