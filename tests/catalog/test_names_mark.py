"""The stores' names kept between reads (``StoreNames.current``, what Dagster's sensors call
each tick): read again exactly when what they follow changed (a store added, a root
relocated, a query renamed or new), and otherwise not at all: the full read lists every
(root, query) pair (a scan of the commit log before migration 0021's table, 1.6 to 2.0 s a
tick at 100,000 stores on PostgreSQL: docs/maintenance.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from state_runtime.catalog import Catalog
from state_runtime.identity import StoreId
from state_runtime.maintenance import StoreNames
from tests.catalog.factory import ROOT, Stream


def _full_reads(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the full read (``root_queries``) on this catalog."""
    calls: list[int] = []
    original = type(catalog).root_queries

    def counted(self: Catalog) -> dict[str, list[str]]:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(type(catalog), "root_queries", counted)
    return calls


def test_names_are_read_again_only_when_what_they_follow_changed(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    clicks = Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/q0", query="clicks")
    clicks.commit()
    Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/q1", query="views").commit()
    full = _full_reads(catalog, monkeypatch)
    first = StoreNames.current(catalog)
    assert first.labels == {f"{ROOT}/q0": "clicks", f"{ROOT}/q1": "views"}
    clicks.commit()  # a batch of a known query: nothing the names follow
    assert StoreNames.current(catalog) is first
    assert len(full) == 1

    changes: list[tuple[Callable[[], object], dict[str, str]]] = [
        (  # a query renamed: its root has two queries, so it is named by its tail
            lambda: Stream(catalog, [StoreId(0, 1)], root=f"{ROOT}/q0", query="taps").commit(),
            {f"{ROOT}/q0": "q0", f"{ROOT}/q1": "views"},
        ),
        (  # a root relocated (its stores' count and ids unchanged)
            lambda: catalog.relocate_root(f"{ROOT}/q1", f"{ROOT}/moved"),
            {f"{ROOT}/q0": "q0", f"{ROOT}/moved": "views"},
        ),
        (  # a store added, no query yet
            lambda: catalog.register_stores(f"{ROOT}/idle", [StoreId(0, 0)], "k int", "v int"),
            {f"{ROOT}/q0": "q0", f"{ROOT}/moved": "views", f"{ROOT}/idle": "idle"},
        ),
    ]
    for n, (change, labels) in enumerate(changes, start=2):
        change()
        assert dict(StoreNames.current(catalog).labels) == labels
        assert dict(StoreNames.current(catalog).labels) == labels
        assert len(full) == n


def test_the_mark_is_one_read_by_index(catalog: Catalog) -> None:
    """``names_mark`` answers on an empty catalog, names the roots in order and counts the
    (root, query) pairs; a batch of a known pair changes nothing."""
    assert catalog.names_mark() == (0, 0, (), 0, 0)
    zeta = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)], root=f"{ROOT}/b", query="zeta")
    zeta.commit()
    Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/a", query="alpha").commit()
    count, newest, roots, pairs, newest_pair = catalog.names_mark()
    assert (count, roots, pairs) == (3, (f"{ROOT}/a", f"{ROOT}/b"), 2)
    assert newest >= 3 and newest_pair >= 2
    zeta.commit()
    assert catalog.names_mark() == (count, newest, roots, pairs, newest_pair)


@pytest.mark.parametrize("first_batch", ["continued", "restarted"])
def test_a_query_moved_to_a_new_checkpoint_location_is_followed(
    catalog: Catalog, first_batch: str
) -> None:
    """The runtime registers a query's stores at its new location before its first batch
    there (the names read then: the new root has no query yet); that batch, a known query
    committing below a known root, changes both roots' labels, and the mark with them (a new
    (root, query) pair), whether its batches go on from the copied checkpoint or restart
    below its old latest (a mark of each query's latest batch missed that one)."""
    clicks = Stream(catalog, [StoreId(0, 0), StoreId(0, 1)], root=f"{ROOT}/q0", query="clicks")
    clicks.commit()
    clicks.commit()
    Stream(catalog, [StoreId(0, 0)], root=f"{ROOT}/v", query="views").commit()
    catalog.register_stores(f"{ROOT}/q1", clicks.stores, "k int", "v int")
    registered = StoreNames.current(catalog)
    assert registered.labels[f"{ROOT}/q1"] == "q1"
    mark = catalog.names_mark()

    moved = Stream(catalog, clicks.stores, root=f"{ROOT}/q1", query="clicks")
    moved.batch = clicks.batch if first_batch == "continued" else 0
    moved.commit()
    assert catalog.names_mark() != mark
    assert dict(StoreNames.current(catalog).labels) == {
        f"{ROOT}/q0": "clicks@q0",
        f"{ROOT}/q1": "clicks@q1",
        f"{ROOT}/v": "views",
    }
    marked = catalog.names_mark()
    moved.commit()  # its next batch: the same stores, nothing the names follow
    assert catalog.names_mark() == marked
