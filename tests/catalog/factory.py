"""Builds realistic CheckpointInfo histories for catalog tests, the way the runtime would.

The histories happen in the past (from :data:`LONG_AGO`, a minute a batch): the catalog's
record of each file is dated as a catalog running then would have dated it
(:func:`recorded_when_written`): at its ``created_at``, or later by ``writers_behind`` when the
writers' clocks run behind the database's.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.store.checkpoint_info import CheckpointInfo

ROOT = "/data/checkpoints/query-a"
QUERY = "11111111-2222-3333-4444-555555555555"
LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)


def info(
    store: StoreId,
    version: int,
    base: str | None,
    *,
    kind: FileKind = FileKind.DELTA,
    lineage: tuple[CheckpointRef, ...] = (),
    created_at: datetime = LONG_AGO,
    checkpoint_id: str | None = None,
    size: int = 1000,
    rows: int = 100,
) -> CheckpointInfo:
    """One checkpoint file's record; a fresh checkpoint id unless one is given."""
    cid = checkpoint_id or uuid.uuid4().hex
    return CheckpointInfo(
        store=store,
        version=version,
        checkpoint_id=cid,
        base_checkpoint_id=base,
        lineage=lineage,
        kind=kind,
        path=store.file_path(version, cid, kind),
        rows=rows,
        file_rows=rows if kind is FileKind.SNAPSHOT else 10,
        bytes_written=size,
        checksum=hashlib.sha256(cid.encode()).hexdigest(),
        created_at=created_at,
    )


def recorded_when_written(
    catalog: Catalog, infos: Iterable[CheckpointInfo], behind: timedelta | None = timedelta(0)
) -> None:
    """Date the catalog's record of each file (``recorded_at``: the catalog stamps it by the
    database's clock, i.e. today) back to when a past history wrote it: ``behind`` after its
    ``created_at``, the writer's clock running that far behind the database's (paths are
    unique: each names its checkpoint id). ``behind`` None leaves the stamps as they are."""
    if behind is None:
        return
    with catalog.engine.begin() as connection:
        for i in infos:
            connection.execute(
                sa.update(checkpoint_files)
                .where(checkpoint_files.c.path == i.path)
                .values(recorded_at=i.created_at + behind)
            )


@dataclass
class Stream:
    """A query's stores committing batch after batch, like the Spark driver does.

    ``committed[store]`` is the committed chain (index = version - 1); ``snapshots`` the
    versions with a snapshot, which bound each new delta's lineage.
    """

    catalog: Catalog
    stores: list[StoreId]
    root: str = ROOT
    query: str = QUERY
    committed: dict[StoreId, list[CheckpointInfo]] = field(default_factory=dict)
    snapshots: dict[StoreId, set[int]] = field(default_factory=dict)
    batch: int = 0
    clock: datetime = LONG_AGO
    writers_behind: timedelta | None = timedelta(0)
    """How far the writers' clocks (``clock``) run behind the catalog's; None keeps the
    catalog's own stamps (a catalog behind a fault proxy: only its own statements pass)."""

    def delta(self, store: StoreId, **kw: object) -> CheckpointInfo:
        """The next version's delta for ``store`` on top of its committed chain."""
        chain = self.committed.get(store, [])
        version = len(chain) + 1
        lineage: list[CheckpointRef] = []
        for ancestor in reversed(chain):
            lineage.append(ancestor.ref)
            if ancestor.version in self.snapshots.get(store, set()):
                break
        base = chain[-1].checkpoint_id if chain else None
        kw.setdefault("created_at", self.clock)
        return info(store, version, base, lineage=tuple(lineage), **kw)

    def commit(
        self, infos: list[CheckpointInfo] | None = None, **kw: object
    ) -> list[CheckpointInfo]:
        """Commit the next batch (fresh deltas for every store unless ``infos`` is given)."""
        infos = infos or [self.delta(s, **kw) for s in self.stores]
        self.catalog.commit_batch(self.root, self.query, self.batch, infos)
        recorded_when_written(self.catalog, infos, self.writers_behind)
        for i in infos:
            self.committed.setdefault(i.store, []).append(i)
        self.batch += 1
        self.clock += timedelta(minutes=1)
        return infos

    def record(self, infos: list[CheckpointInfo]) -> None:
        """Record files written but not committed (an attempt in flight, or one that lost)."""
        self.catalog.record_files(self.root, infos)
        recorded_when_written(self.catalog, infos, self.writers_behind)

    def run(self, batches: int, **kw: object) -> None:
        for _ in range(batches):
            self.commit(**kw)

    def snapshot(
        self, store: StoreId, version: int | None = None, *, verified: bool = True
    ) -> CheckpointInfo:
        """A snapshot of a committed version (default: the latest), recorded in the catalog as
        the snapshot pass records one: verified after it was written (unless told not)."""
        chain = self.committed[store]
        target = chain[(version or len(chain)) - 1]
        snap = info(
            store,
            target.version,
            target.base_checkpoint_id,
            kind=FileKind.SNAPSHOT,
            lineage=target.lineage,
            checkpoint_id=target.checkpoint_id,
            created_at=self.clock,
        )
        self.catalog.record_snapshot(self.root, snap, verified=verified)
        recorded_when_written(self.catalog, [snap], self.writers_behind)
        if verified:
            self.snapshots.setdefault(store, set()).add(target.version)
        return snap
