"""A fleet of stores built through the runtime's own calls, without Spark (issue 35).

``queries`` streaming queries, each one root on local disk with ``partitions`` stores (Spark's
default 200 state partitions of one stateful operator). Each batch writes a tiny delta per
store through the store itself (:class:`~state_runtime.StateStoreProvider`: a few keys
updated) and commits the query's batch through :meth:`Catalog.commit_batch`, as the runtime's
driver does. Every ``snapshot_every`` versions a store writes a snapshot through its provider
(at a phase staggered by partition, so that in any hour only some stores fall due), recorded
with :meth:`Catalog.record_files` and verified, as the snapshot pass records its own.

Only query 0 is written that way; every other query is its copy (:func:`copy_root`: the
catalog's records copied by set-based SQL, the files hard-linked; each copy's commits under its
own query id, as each query of a real fleet commits under its own), so that 20,000 and 100,000
stores are built in minutes, where writing each store version costs 6 to 8 ms of CPU (100,000
stores x 12 versions: about 2 hours on two cores). :func:`build` writes the history
(``versions`` batches) and records every file of it verified, as the last validation would
have left it; :func:`advance` writes more batches (the new work of the next hour) and
records nothing else, query 0's then copied to the others above their latest version. The
template is written in a worker process that skips ``fsync`` (writing many small files, it
is most of the time otherwise; the fleet's files need no durability); the passes measured
afterwards run with it.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
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


def _in_worker(url: str, folder: Path, shape: Shape, batches: int, history: bool) -> None:
    """:func:`write_batches` of query 0 in a worker process that skips ``fsync`` (module
    docstring: the passes measured in this process keep it)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, context, initializer=_without_fsync) as pool:
        pool.submit(write_batches, url, folder, 0, shape, batches, history).result()


def _each_copy(title: str, catalog: Catalog, folder: Path, shape: Shape, above: int) -> None:
    """Query 0 copied to every other query (:func:`copy_root`, ``above``), with a progress bar."""
    template = folder / query_id(0)
    with Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(title, total=shape.queries - 1)
        for query in range(1, shape.queries):
            copy_root(catalog, template, folder / query_id(query), above=above)
            bar.update(task, advance=1)


def build(url: str, folder: Path, shape: Shape) -> float:
    """The fleet's history (every file recorded verified, as the last validation left it):
    query 0 written through the runtime's calls, then copied to every other query; returns
    the seconds it took."""
    started = time.perf_counter()
    _in_worker(url, folder, shape, shape.versions, True)
    catalog = Catalog.open(url)
    try:
        _each_copy("fleet", catalog, folder, shape, 0)
    finally:
        catalog.close()
    return time.perf_counter() - started


def advance(url: str, folder: Path, shape: Shape, batches: int) -> float:
    """``batches`` new batches of every query, nothing verified yet: query 0's written through
    the runtime's calls, then copied to every other query (each must be as query 0 was
    before: built by :func:`build` and maintained alike); returns the seconds it took."""
    started = time.perf_counter()
    catalog = Catalog.open(url)
    try:
        above = max(r.latest.version for r in catalog.stores(query_storage(folder, 0).uri))
        _in_worker(url, folder, shape, batches, False)
        _each_copy("new batches", catalog, folder, shape, above)
    finally:
        catalog.close()
    return time.perf_counter() - started


def _copy_records(
    connection: sa.Connection, template: str, root: str, query: str, above: int
) -> list[str]:
    """Copy the catalog's records of ``template``'s stores below ``root``: set-based
    ``INSERT ... SELECT``, each store's rows its own, the commits under query id ``query``
    (not the template's). ``above`` 0: the stores, their files and
    commit log; else only the files and commits above version ``above``, ``root``'s stores
    taking the template's latest version. Returns the paths of the files copied above
    ``above`` (none for a whole copy: its files are linked by walking the folder)."""
    old, new = stores.alias("old"), stores.alias("new")
    same_store = sa.and_(
        new.c.checkpoint_root == root,
        new.c.operator_id == old.c.operator_id,
        new.c.partition_id == old.c.partition_id,
        new.c.store_name == old.c.store_name,
    )
    if above == 0:
        names = [c.name for c in stores.columns if c.name not in ("store_id", "checkpoint_root")]
        connection.execute(
            stores.insert().from_select(
                [*names, "checkpoint_root"],
                sa.select(
                    *(stores.c[n] for n in names), sa.literal(root, stores.c.checkpoint_root.type)
                ).where(stores.c.checkpoint_root == template),
            )
        )
    else:
        latest = ("latest_version", "latest_checkpoint_id", "last_committed_at")
        connection.execute(
            sa.update(new)
            .where(same_store, old.c.checkpoint_root == template)
            .values({n: old.c[n] for n in latest})
        )
    f = checkpoint_files
    names = [c.name for c in f.columns if c.name not in ("file_id", "store_id")]
    copied = (
        sa.select(*(f.c[n] for n in names), new.c.store_id)
        .join(old, old.c.store_id == f.c.store_id)
        .join(new, same_store)
        .where(old.c.checkpoint_root == template, f.c.version > above)
    )
    connection.execute(f.insert().from_select([*names, "store_id"], copied))
    c, new_file = commit_log, checkpoint_files.alias("new_file")
    names = [
        n.name for n in c.columns if n.name not in ("commit_id", "query_id", "store_id", "file_id")
    ]
    connection.execute(
        c.insert().from_select(
            [*names, "query_id", "store_id", "file_id"],
            sa.select(
                *(c.c[n] for n in names),
                sa.literal(query, c.c.query_id.type),
                new.c.store_id,
                new_file.c.file_id,
            )
            .join(old, old.c.store_id == c.c.store_id)
            .join(new, same_store)
            .join(f, f.c.file_id == c.c.file_id)
            .join(
                new_file,
                sa.and_(new_file.c.store_id == new.c.store_id, new_file.c.path == f.c.path),
            )
            .where(old.c.checkpoint_root == template, c.c.version > above),
        )
    )
    return list(connection.scalars(copied.with_only_columns(f.c.path))) if above else []


def copy_root(catalog: Catalog, template: Path, root: Path, *, above: int = 0) -> None:
    """Another query just like the one at ``template`` (a root on local disk), at ``root``:
    its catalog records copied in one transaction, its files hard-linked. The bulk path of a
    large fleet or backlog (memory tests and benchmarks): a query copied in a fraction of a
    second, where committing it batch by batch takes seconds (61 store versions/s).

    The copy is its own query: its commits carry the query id ``root``'s folder name (as
    :func:`query_id` names the fleet's), not the template's, so each root is labelled by its
    own query (:mod:`state_runtime.maintenance.store_names`). Checkpoint ids stay the
    template's: each file's name and header carry its own, and a checkpoint id names a version
    of one store (the catalog keys it by store), so no two stores share one in any lookup.

    ``above`` > 0: only the template's versions above ``above`` (its new batches), onto a
    copy made before them and maintained since as the template was."""
    if not above:
        copy_roots(catalog, template, [root])
        return
    with catalog.engine.begin() as connection:
        paths = _copy_records(
            connection, LocalStorage(template).uri, LocalStorage(root).uri, root.name, above
        )
    for path in paths:
        os.link(template / path, root / path)


def copy_roots(catalog: Catalog, template: Path, roots: Sequence[Path]) -> None:
    """:func:`copy_root` (a whole copy) of ``template`` to each of ``roots``, the hard links
    made by GNU ``cp -al`` (:func:`_link_tree`, two at a time) in other threads while the
    catalog's records are copied (one transaction a root): 2.7x faster than :func:`copy_root`
    root by root in the one pair measured (docs/maintenance.md, *The 5M backlog*), 5,000,000
    files in 20 minutes.

    On an error (a record copy failing, or a root that cannot be linked, :class:`LinkFailed`,
    seen before the next root's records are copied) the links not yet started are cancelled
    and the running ones waited for before it is raised: it does not go on linking or
    copying the other roots."""
    source = LocalStorage(template).uri
    with ThreadPoolExecutor(2) as linker:
        linked = [linker.submit(_link_tree, template, root) for root in roots]
        try:
            for root in roots:
                _raise_failed_link(linked)
                with catalog.engine.begin() as connection:
                    _copy_records(connection, source, LocalStorage(root).uri, root.name, 0)
            for done in linked:
                done.result()
        except BaseException:
            linker.shutdown(cancel_futures=True)  # waits for the running links
            raise


def _raise_failed_link(linked: Sequence[Future[None]]) -> None:
    """The error of the first link that failed so far, if any."""
    for done in linked:
        if done.done() and done.exception() is not None:
            done.result()


class LinkFailed(OSError):
    """A root's files could not be hard-linked from its template (``cp -al`` failed, or the
    root's folder could not be made)."""


def _link_tree(template: Path, root: Path) -> None:
    """Every file below ``template`` hard-linked at the same place below ``root``: ``cp -al``,
    one process and no Python call a file. GNU coreutils' ``cp`` only (as on Linux): ``-a`` and
    ``-l`` are not POSIX options."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["cp", "-al", f"{template}/.", str(root)], check=True, capture_output=True, text=True
        )
    except subprocess.CalledProcessError as e:
        raise LinkFailed(f"{template} not linked at {root}: {e.stderr.strip()}") from e
    except OSError as e:
        raise LinkFailed(f"{template} not linked at {root}: {e}") from e
