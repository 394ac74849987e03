"""The loss check of a failed batch (:func:`state_runtime.runtime.loss.lost_state`) over a
snapshot recorded as failed verification: on real files and a real catalog, without Spark.

It reads such a snapshot again only when the catalog's chain has a file gone or damaged (a
sink's failure over a complete chain reads nothing: failed before its fix, review of the
expired branch), and one that reads intact is the base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from state_runtime.catalog import Catalog
from state_runtime.errors import CheckpointFileCorrupt, StateLost
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.runtime.loss import lost_state
from state_runtime.storage import LocalStorage
from tests.maintenance.streams import StoreStream

A = StoreId(0, 0)
TASK = RuntimeError("a task of the batch failed")  # not a loading error: existence checks only


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[StoreStream]:
    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}", upgrade=True)
    yield StoreStream(catalog, LocalStorage(tmp_path / "ckpt"), [A])
    catalog.close()


def failed_snapshot(stream: StoreStream, version: int) -> Path:
    """A snapshot of ``version`` written, recorded, and recorded as failed verification."""
    info = stream.committed[A][version - 1]
    snap = stream.provider(A).snapshot(version, info.checkpoint_id)
    stream.catalog.record_files(stream.root, [snap])
    stream.catalog.record_verifications(stream.root, {snap.path: "checksum differs"})
    return stream.storage.root / snap.path


def flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF
    file.write_bytes(bytes(data))


def delta(stream: StoreStream, version: int) -> Path:
    return stream.storage.root / stream.committed[A][version - 1].path


def check(stream: StoreStream, error: BaseException = TASK) -> StateLost | None:
    latest = stream.committed[A][-1]
    base = {A: CheckpointRef(latest.version, latest.checkpoint_id)}
    return lost_state(stream.catalog, stream.storage, stream.query, stream.batch, base, error)


def test_a_failure_over_a_complete_chain_reads_no_failed_snapshot(stream: StoreStream) -> None:
    stream.run(6)
    damaged = [failed_snapshot(stream, v) for v in (3, 4, 5)]
    for file in damaged:
        flip(file)
    before = stream.storage.requests.bytes_read
    assert check(stream) is None
    assert stream.storage.requests.bytes_read == before


def test_a_snapshot_intact_again_is_the_base_and_a_loss_above_it_is_named(
    stream: StoreStream,
) -> None:
    stream.run(5)
    failed_snapshot(stream, 3)
    delta(stream, 2).unlink()
    assert stream.loaded(A, 5) == stream.expected(A, 5)  # a cold load loads from the snapshot
    assert check(stream) is None
    flip(delta(stream, 4))  # above the snapshot: the loader fails on it
    lost = check(stream, CheckpointFileCorrupt("bad bytes", path="any"))
    assert isinstance(lost, StateLost)
    assert stream.committed[A][3].path in str(lost)
    assert stream.committed[A][1].path not in str(lost)
