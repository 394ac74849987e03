"""Cleanup with zero windows racing a stream and a cold reader, over more than 100 versions.

The stream commits batch after batch; maintenance snapshots and cleans as fast as it can, with
no retention window at all; a cold reader (a fresh provider listing storage, as a new worker
or a recovering driver does) keeps loading the last two committed versions. Every load of a
version that is still retained must succeed on the first try, with the right rows; and an
independent model, written here from the design's definition (not the library's rule), checks
each deletion in the ledger: at the time of the deletion the file was not needed by the last
two committed versions, given the commits and the snapshots verified up to then. (This is
the race of issue 10 in which a cold load listed the folder, cleanup then removed deltas a
newer verified snapshot replaced, and the load failed with LineageBroken; the loader now
lists again.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa

from state_runtime import StateStoreProvider
from state_runtime.catalog import Catalog, RetentionPolicy
from state_runtime.catalog.schema.tables import checkpoint_files
from state_runtime.identity import FileKind, StoreId
from state_runtime.maintenance import Fleet, MaintenancePolicy, cleanup_pass, snapshot_pass
from tests.gates import Gates
from tests.maintenance.streams import KEY, VALUE, StoreStream

VERSIONS = 110
# No retention window at all: a committed file goes the moment no retained version needs it.
# The grace for never-committed files stays: with none, the sweep of unfinished writes would
# remove a writer's temporary file mid-write and fail that commit (safely, but the stream
# would stop); no never-committed file appears here otherwise.
ZERO = MaintenancePolicy(
    snapshot_min_deltas=3,
    retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(hours=1)),
    min_window=timedelta(0),
)


@dataclass
class Reads:
    """What the cold reader saw: rows per (store, version), and the loads that failed."""

    rows: dict[tuple[StoreId, int], dict[str, int]] = field(default_factory=dict)
    loads: int = 0
    failures: list[str] = field(default_factory=list)
    superseded: int = 0  # the version stopped being retained while it was read


def latest_two(catalog: Catalog, root: str, store: StoreId) -> list[tuple[int, str]]:
    return [
        (e.ref.version, str(e.ref.checkpoint_id))
        for e in catalog.commit_history(root, store=store, limit=2)
    ]


def cold_reader(stream: StoreStream, stop: threading.Event, reads: Reads, gates: Gates) -> None:
    while not stop.is_set():
        for store in stream.stores:
            for version, checkpoint_id in latest_two(stream.catalog, stream.root, store):
                provider = StateStoreProvider(
                    stream.storage, store.operator_id, store.partition_id, store.store_name,
                    key_schema=KEY, value_schema=VALUE,
                )  # fmt: skip
                reads.loads += 1
                try:
                    loaded = provider.get_read_store(version, checkpoint_id)
                    reads.rows[(store, version)] = {k[0]: v[0] for k, v in loaded.items()}
                except Exception as exc:
                    newest = latest_two(stream.catalog, stream.root, store)[0][0]
                    if version >= newest - 1:
                        reads.failures.append(f"{store} version {version}: {exc!r}")
                    else:
                        reads.superseded += 1
        gates.made("reads")


def maintainer(
    catalog: Catalog, stop: threading.Event, errors: list[BaseException], gates: Gates
) -> int:
    fleet = Fleet(catalog, owner="race")
    while not stop.is_set():
        try:
            snapshot_pass(fleet, ZERO)
            cleanup_pass(fleet, ZERO, dry_run=False)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
            return 0
        gates.made("maintenance")
    return 0


@dataclass(frozen=True)
class History:
    """What the catalog recorded: when each version committed, when each snapshot was
    verified, and what was deleted when."""

    committed: dict[StoreId, dict[int, tuple[str, datetime]]]
    verified: dict[StoreId, dict[tuple[int, str], datetime]]
    files: dict[str, tuple[StoreId, FileKind, int, str]]
    deleted: dict[str, datetime]


def history(stream: StoreStream) -> History:
    catalog = stream.catalog
    committed = {
        store: {
            e.ref.version: (str(e.ref.checkpoint_id), e.committed_at)
            for e in catalog.commit_history(stream.root, store=store, limit=10_000)
        }
        for store in stream.stores
    }
    by_dir = {store.directory: store for store in stream.stores}
    f = checkpoint_files.c
    with catalog.engine.connect() as connection:
        rows = connection.execute(
            sa.select(f.path, f.kind, f.version, f.checkpoint_id, f.verified_at, f.verification)
        ).all()
    files, verified = {}, {store: {} for store in stream.stores}
    for row in rows:
        store = by_dir[row.path.rsplit("/", 1)[0]]
        files[row.path] = (store, FileKind(row.kind), row.version, row.checkpoint_id)
        if row.kind == "snapshot" and row.verification == "verified":
            verified[store][(row.version, row.checkpoint_id)] = row.verified_at
    deleted = {
        d.path: d.deleted_at for d in catalog.deletion_history(root=stream.root, limit=100_000)
    }
    return History(committed, verified, files, deleted)


def needed_at(h: History, store: StoreId, when: datetime) -> set[tuple[FileKind, int, str]]:
    """The model: the last two versions committed by ``when``; each loads from its own
    snapshot if one was verified by then, else from its delta on top of the version below."""
    chain = {v: cid for v, (cid, at) in h.committed[store].items() if at <= when}
    latest = max(chain, default=0)
    needed: set[tuple[FileKind, int, str]] = set()
    for top in (latest, latest - 1):
        version = top
        while version >= 1:
            cid = chain[version]
            at = h.verified[store].get((version, cid))
            if at is not None and at <= when:
                needed.add((FileKind.SNAPSHOT, version, cid))
                break
            needed.add((FileKind.DELTA, version, cid))
            version -= 1
    return needed


def test_cleanup_racing_a_stream_and_a_cold_reader(
    make_stream: Callable[..., StoreStream],
) -> None:
    stream = make_stream(stores=[StoreId(0, 0), StoreId(0, 1)], keys_per_store=20)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = Reads()
    gates = Gates("maintenance", "reads")
    threads = [
        threading.Thread(target=maintainer, args=(stream.catalog, stop, errors, gates)),
        threading.Thread(target=cold_reader, args=(stream, stop, reads, gates)),
    ]
    for thread in threads:
        thread.start()
    try:
        # Each commit waits for a maintenance round and a round of cold reads since the
        # last one, so the counts below hold however loaded the machine is.
        for _ in range(VERSIONS):
            if not gates.passed(stop):
                break
            stream.commit()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    h = history(stream)
    assert len(h.deleted) > VERSIONS, "cleanup kept up with the stream"
    for path, when in h.deleted.items():
        store, kind, version, cid = h.files[path]
        assert (kind, version, cid) not in needed_at(h, store, when), (
            f"{path} was deleted at {when} while the last two committed versions needed it"
        )
    for (store, version), rows in reads.rows.items():
        assert rows == stream.expected(store, version)
    assert reads.loads > 50 and len(reads.rows) > 20
    for store in stream.stores:  # the end state: both retained versions load from storage
        for version in (VERSIONS, VERSIONS - 1):
            assert stream.loaded(store, version) == stream.expected(store, version)
    assert not reads.failures, reads.failures[:5]
