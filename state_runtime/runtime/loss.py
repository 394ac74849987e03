"""What a failed batch says when storage lost or damaged a file the catalog recorded.

A batch whose tasks cannot load their base version fails inside Spark, whose error is the
whole Python traceback of a task (hundreds of lines ending in the loader's error). When a batch
fails, the driver checks the files that load each store's base version (the catalog's
inventory, one existence check per file, and a read and verification of each when the batch
failed loading state: this runs only after a failure). If one is gone or damaged, the batch
fails with :class:`StateLost`, one paragraph naming the store, the file and the cause, with
the file's fate and the next command as every tool gives them
(:func:`state_runtime.maintenance.damage.classify`: the restorable batch as ``restore``
computes it, the Spark checkpoint the driver was given), and the loss is recorded as a
problem on the store, so that ``statestore health`` calls it broken at once and says the
same.

Through ``foreachBatch`` the paragraph reaches the driver inside Spark's own error (a
``StreamingQueryException``): :func:`state_runtime.failures.failure_paragraph` finds it there,
as any of our errors, for the one paragraph to show the user.
"""

from __future__ import annotations

from state_runtime.catalog import BatchStart, Catalog, FileRecord, FoundProblem, StoreKey
from state_runtime.errors import CannotLoadState, StateLost
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance.chains import Verified, walk_chain
from state_runtime.maintenance.damage import Damage, Fate, classify
from state_runtime.maintenance.fleet import Fleet
from state_runtime.retention import loading_files
from state_runtime.storage import Storage
from state_runtime.store.file_verification import MISSING, UNREADABLE


def lost_state(
    catalog: Catalog,
    storage: Storage,
    query_id: str,
    batch_id: int,
    bases: dict[StoreId, CheckpointRef],
    error: BaseException,
    spark_checkpoint: str | None = None,
) -> StateLost | None:
    """The loss behind a failed batch, recorded on its store; None if every file is there.

    Each file that loads a store's base version is looked up in storage; when the batch
    failed loading state (``error`` names a loading error's code), each is also read and
    verified, for a truncated or altered file. Only when the catalog's chain has a file gone
    or damaged are the chains walked as restore walks them (:func:`walk_chain`): a base
    snapshot gone or damaged is passed over for the chain below it, where a failed snapshot
    that reads intact now is a base again, as the loader takes it. A store whose version
    loads that way is no loss, nor is one that does not load only while storage cannot read
    a snapshot (a failed read: no verdict). Each file found gone or damaged is classified
    (:func:`classify`) for the paragraph's advice, with the query's ``spark_checkpoint``, and
    recorded as a problem; the first that loses the version is the loss.
    """
    root = storage.uri
    fleet = Fleet(catalog, roots=[root], open_storage=lambda _: storage)
    checked = Verified()
    deep = any(f"[{code}]" in str(error) for code in _loading_codes(CannotLoadState))

    def cause(record: FileRecord) -> str | None:
        """What is wrong with ``record`` now (None: nothing found)."""
        if deep:
            return checked.problem(fleet, root, record)
        return None if storage.exists(record.path) else MISSING

    for store, ref in sorted(bases.items()):
        key = StoreKey(root, store)
        files = checked.store_files(fleet, key)
        by_path = {f.path: f for f in files}
        chain = loading_files([f.facts() for f in files], ref.version)
        if all(cause(by_path[f.path]) is None for f in chain):
            continue
        walk = walk_chain(fleet, key, ref.version, checked, cause)
        if walk.unreadable is not None:
            continue  # storage cannot read a snapshot that may load it now: no verdict
        for record, problem in walk.damaged:
            if walk.loads and problem.startswith(UNREADABLE):
                continue  # a failed read of a snapshot the load does not need: no damage
            damage = classify(
                fleet, record, problem, spark_checkpoint=spark_checkpoint, checked=checked
            )
            found = FoundProblem(damage.paragraph(store=False), record.path, record.version)
            catalog.add_problems(key, [found])
            if not walk.loads and damage.fate is not Fate.REPAIRABLE:
                return _lost(damage, query_id, batch_id)
    return None


def _lost(damage: Damage, query_id: str, batch_id: int) -> StateLost:
    lost = StateLost(
        f"batch {batch_id} of query {query_id} cannot load its state: {damage.paragraph()}"
    )
    lost.store = damage.key  # for callers (details(), telemetry); the message names it already
    lost.path = damage.file.path
    return lost


def _loading_codes(error: type[CannotLoadState]) -> set[str]:
    """The codes of ``error`` and of every error that derives from it."""
    return {error.code}.union(*(_loading_codes(sub) for sub in error.__subclasses__()))


def refuse_expired_base(start: BatchStart, query_id: str, batch_id: int) -> None:
    """Fail a batch whose base version of a store expired (cleanup deleted the files it loads
    through) before any task runs: a worker that still caches that version would otherwise
    build on it and commit a version no load from files can read (a cold worker fails
    loading it)."""
    for store, through in sorted(start.expired.items()):
        ref = start.previous[store]
        raise StateLost(
            f"batch {batch_id} of query {query_id} builds on version {ref.version} of {store}, "
            f"which expired (cleanup deleted the files that load versions up to {through}): "
            "its state is gone; restore the query to a batch whose stores load",
            store=store,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
        )
