"""A reader's positions (``sql/positions.py``): each row read once, whatever order its
writers commit in, on a real second connection holding a transaction open."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from state_runtime.catalog import BatchMetrics, Catalog, Position, Unsettled
from state_runtime.catalog.sql import batch_metrics
from tests.catalog.settled import settled

ROOT = "/data/checkpoints/query-a"


def figures(rows: int) -> BatchMetrics:
    return BatchMetrics(rows, 1, 5, 64, 1.5, 1, 0, {})


def test_a_replayed_batch_keeps_its_position_and_is_not_read_again(catalog: Catalog) -> None:
    catalog.record_batch_metrics(ROOT, "q", 0, figures(1))
    [(first, _)] = settled(lambda: catalog.batch_metrics_after(Position()), 1)
    catalog.record_batch_metrics(ROOT, "q", 0, figures(2))  # the batch replayed
    catalog.record_batch_metrics(ROOT, "q", 1, figures(3))
    found = settled(lambda: catalog.batch_metrics_after(first), 1)
    assert [(m.batch_id, m.metrics.rows_in) for _, m in found] == [(1, 3)]
    [(again, replayed), _] = catalog.batch_metrics_after(Position())
    assert again == first and replayed.metrics.rows_in == 2
    assert catalog.unsettled(found[-1][0], Position(1 << 62)) == Unsettled()


@pytest.mark.postgres
def test_a_lower_id_committed_after_a_read_passed_a_higher_one_is_read_next(
    pg_catalog: Catalog,
) -> None:
    """The lower id's transaction, held open, holds the newer row back: a read past the newer
    row's id cannot happen before the older row is visible."""
    catalog = pg_catalog
    with catalog.engine.connect() as slow, slow.begin():
        batch_metrics.record_batch_metrics(slow, ROOT, "q", 0, figures(0), catalog.now())
        catalog.record_batch_metrics(ROOT, "q", 1, figures(1))  # a higher id, committed
        assert catalog.batch_metrics_after(Position()) == []  # not past the open one
    found = settled(lambda: catalog.batch_metrics_after(Position()), 2)
    assert [m.batch_id for _, m in found] == [0, 1]
    assert found[0][0] < found[1][0] and found[0][0].row < found[1][0].row
    assert catalog.batch_metrics_after(found[-1][0]) == []


@contextmanager
def writing_elsewhere(catalog: Catalog) -> Iterator[None]:
    """A writing transaction held open in another database of the same server (the catalog's
    readers wait for every one of the server's)."""
    other = sa.create_engine(catalog.engine.url.set(database="postgres"))
    try:
        with other.connect() as held, held.begin():
            held.execute(sa.text("SELECT pg_current_xact_id()"))  # takes a transaction id
            yield
    finally:
        other.dispose()


@pytest.mark.postgres
def test_a_writing_transaction_in_another_database_holds_reads_back_and_is_shown(
    pg_catalog: Catalog,
) -> None:
    catalog = pg_catalog
    catalog.record_batch_metrics(ROOT, "q", 0, figures(0))
    [(first, _)] = settled(lambda: catalog.batch_metrics_after(Position()), 1)
    with writing_elsewhere(catalog):
        time.sleep(1.1)
        catalog.record_batch_metrics(ROOT, "q", 1, figures(1))
        assert catalog.batch_metrics_after(first) == []
        waiting = catalog.unsettled(first, Position(1 << 62))
    assert waiting.rows == 1 and waiting.oldest_write is not None
    assert waiting.oldest_write.total_seconds() >= 1
    [(second, _)] = settled(lambda: catalog.batch_metrics_after(first), 1)
    assert catalog.unsettled(second, Position(1 << 62)) == Unsettled()
