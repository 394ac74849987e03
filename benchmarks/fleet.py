"""A fleet of stores built through the runtime's own calls, without Spark (issue 35).

``queries`` streaming queries, each one root on local disk with ``partitions`` stores (Spark's
default 200 state partitions of one stateful operator). Each batch writes a tiny delta per
store through the store itself (:class:`~state_runtime.StateStoreProvider`: a few keys
updated) and commits the query's batch through :meth:`Catalog.commit_batch`, as the runtime's
driver does. Every ``snapshot_every`` versions a store writes a snapshot through its provider
(at a phase staggered by partition, so that in any hour only some stores fall due), recorded
with :meth:`Catalog.record_files` and verified, as the snapshot pass records its own.

:func:`build` writes the history (``versions`` batches) and records every file of it
verified, as the last validation would have left it; :func:`advance` writes more batches
(the new work of the next hour) and records nothing else. Queries are spread over worker
processes, each writing one query at a time (a provider per store, dropped after the query).
The fleet's files need no durability, so a worker process skips ``fsync`` (writing many small
files, it is most of the time otherwise); the passes measured afterwards run with it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from state_runtime import CheckpointInfo, StateStoreProvider
from state_runtime.catalog import Catalog
from state_runtime.catalog.schema.tables import checkpoint_files, commit_log, stores
from state_runtime.identity import StoreId
from state_runtime.storage import LocalStorage

KEY_SCHEMA, VALUE_SCHEMA = "k bigint", "v bigint"
FIRST_KEYS, UPDATED_KEYS = 20, 2


@dataclass(frozen=True)
class Shape:
    """A fleet's size and history: ``queries`` x ``partitions`` stores, ``versions`` batches
    each, a snapshot every ``snapshot_every`` versions."""

    queries: int
    partitions: int = 200
    versions: int = 12
    snapshot_every: int = 10

    @property
    def stores(self) -> int:
        return self.queries * self.partitions


def query_storage(folder: Path, query: int) -> LocalStorage:
    """The storage of query ``query``: its own root under ``folder``."""
    return LocalStorage(folder / f"query-{query:05d}")


def query_id(query: int) -> str:
    return f"query-{query:05d}"


def write_batches(
    url: str, folder: Path, query: int, shape: Shape, batches: int, history: bool
) -> int:
    """Writes ``batches`` more batches of query ``query`` (registering its stores first if
    new); for the ``history``, each store's snapshot when its phase falls due and every file
    recorded verified (as past maintenance left them); returns the store versions written."""
    catalog = Catalog.open(url)
    storage = query_storage(folder, query)
    try:
        stores = [StoreId(0, p) for p in range(shape.partitions)]
        latest = {r.key.store: r.latest for r in catalog.stores(storage.uri)}
        if not latest:
            catalog.register_stores(storage.uri, stores, KEY_SCHEMA, VALUE_SCHEMA)
        batch_infos: list[list[CheckpointInfo]] = [[] for _ in range(batches)]
        snapshots: list[CheckpointInfo] = []
        for store in stores:  # a store at a time: the version cache holds one store's
            provider = StateStoreProvider(
                storage, 0, store.partition_id, key_schema=KEY_SCHEMA, value_schema=VALUE_SCHEMA
            )
            base = latest.get(store)
            for infos in batch_infos:
                version = base.version if base else 0
                state = provider.get_store(version, base.checkpoint_id if base else None)
                keys = range(FIRST_KEYS) if version == 0 else range(version, version + UPDATED_KEYS)
                for k in keys:
                    state.put((k % FIRST_KEYS,), (version,))
                info = state.commit()
                infos.append(info)
                if history and (info.version + store.partition_id) % shape.snapshot_every == 0:
                    snapshots.append(provider.snapshot(info.version, info.checkpoint_id))
                base = info.ref
            provider.drop_cache()
        for infos in batch_infos:  # then each batch committed in order, as the driver does
            catalog.commit_batch(storage.uri, query_id(query), infos[0].version - 1, infos)
        if snapshots:
            catalog.record_files(storage.uri, snapshots)
        checked = [*snapshots, *(i for infos in batch_infos for i in infos)] if history else []
        if checked:
            catalog.record_verifications(storage.uri, {i.path: None for i in checked})
        return batches * len(stores)
    finally:
        catalog.close()


def _without_fsync() -> None:
    """A worker's files need no durability (module docstring)."""
    os.fsync = lambda fd: None


def _each_query(
    title: str, url: str, folder: Path, shape: Shape, batches: int, history: bool, processes: int
) -> float:
    """:func:`write_batches` over every query, in ``processes`` worker processes (0: in this
    one), with a progress bar and its rate; returns the store versions written per second."""
    started = time.perf_counter()
    columns = (
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
    )
    written = 0
    with Progress(*columns) as bar:
        task = bar.add_task(title, total=shape.queries, rate="")

        def done(count: int) -> None:
            nonlocal written
            written += count
            rate = written / (time.perf_counter() - started)
            bar.update(task, advance=1, rate=f"{rate:,.0f} store versions/s")

        arguments = [(url, folder, q, shape, batches, history) for q in range(shape.queries)]
        if processes == 0:
            for args in arguments:
                done(write_batches(*args))
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(processes, context, initializer=_without_fsync) as pool:
                for future in as_completed([pool.submit(write_batches, *a) for a in arguments]):
                    done(future.result())
    return written / (time.perf_counter() - started)


def build(url: str, folder: Path, shape: Shape, processes: int = 2) -> float:
    """The fleet's history (every file recorded verified, as the last validation left it);
    returns the store versions written per second."""
    return _each_query("fleet", url, folder, shape, shape.versions, True, processes)


def advance(url: str, folder: Path, shape: Shape, batches: int, processes: int = 2) -> float:
    """``batches`` new batches of every query, nothing verified yet; returns the rate."""
    return _each_query("new batches", url, folder, shape, batches, False, processes)


def _copy_records(connection: sa.Connection, template: str, root: str) -> None:
    """Copy the catalog's records of ``template``'s stores (their rows, files and commit
    log) below ``root``: set-based ``INSERT ... SELECT``, each store's rows its own."""
    names = [c.name for c in stores.columns if c.name not in ("store_id", "checkpoint_root")]
    connection.execute(
        stores.insert().from_select(
            [*names, "checkpoint_root"],
            sa.select(
                *(stores.c[n] for n in names), sa.literal(root, stores.c.checkpoint_root.type)
            ).where(stores.c.checkpoint_root == template),
        )
    )
    old, new = stores.alias("old"), stores.alias("new")
    same_store = sa.and_(
        new.c.checkpoint_root == root,
        new.c.operator_id == old.c.operator_id,
        new.c.partition_id == old.c.partition_id,
        new.c.store_name == old.c.store_name,
    )
    f = checkpoint_files
    names = [c.name for c in f.columns if c.name not in ("file_id", "store_id")]
    connection.execute(
        f.insert().from_select(
            [*names, "store_id"],
            sa.select(*(f.c[n] for n in names), new.c.store_id)
            .join(old, old.c.store_id == f.c.store_id)
            .join(new, same_store)
            .where(old.c.checkpoint_root == template),
        )
    )
    c, new_file = commit_log, checkpoint_files.alias("new_file")
    names = [n.name for n in c.columns if n.name not in ("commit_id", "store_id", "file_id")]
    connection.execute(
        c.insert().from_select(
            [*names, "store_id", "file_id"],
            sa.select(*(c.c[n] for n in names), new.c.store_id, new_file.c.file_id)
            .join(old, old.c.store_id == c.c.store_id)
            .join(new, same_store)
            .join(f, f.c.file_id == c.c.file_id)
            .join(
                new_file,
                sa.and_(new_file.c.store_id == new.c.store_id, new_file.c.path == f.c.path),
            )
            .where(old.c.checkpoint_root == template),
        )
    )


def copy_root(catalog: Catalog, template: Path, root: Path) -> None:
    """Another query just like the one at ``template`` (a root on local disk), at ``root``:
    its catalog records copied in one transaction, its files hard-linked. The bulk path of a
    large fleet or backlog (memory tests and benchmarks): a query copied in a fraction of a
    second, where committing it batch by batch takes seconds (61 store versions/s)."""
    with catalog.engine.begin() as connection:
        _copy_records(connection, LocalStorage(template).uri, LocalStorage(root).uri)
    for folder, _, names in os.walk(template):
        target = root / Path(folder).relative_to(template)
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            os.link(Path(folder) / name, target / name)
