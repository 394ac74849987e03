"""What a failed batch says when storage lost a file the catalog recorded.

A batch whose tasks cannot load their base version fails inside Spark, whose error is the
whole Python traceback of a task (hundreds of lines ending in the loader's error). When a batch
fails, the driver checks the files that load each store's base version (the catalog's
inventory, one existence check per file: this runs only after a failure). If one is gone, the
batch fails with :class:`StateLost`, one paragraph naming the file, the version, the store and
the commands to run next, and the loss is recorded as a problem on the store, so that
``statestore health`` calls it broken at once.

Through ``foreachBatch`` the paragraph reaches the driver inside Spark's own error (a
``StreamingQueryException``): :func:`state_runtime.failures.failure_paragraph` finds it there,
as any of our errors, for the one paragraph to show the user.
"""

from __future__ import annotations

from state_runtime.catalog import Catalog, FoundProblem, StoreKey
from state_runtime.errors import StateLost
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.retention import loading_files
from state_runtime.storage import Storage


def lost_state(
    catalog: Catalog,
    storage: Storage,
    query_id: str,
    batch_id: int,
    bases: dict[StoreId, CheckpointRef],
) -> StateLost | None:
    """The loss behind a failed batch, recorded on its store; None if every file is there."""
    root = storage.uri
    for store, ref in sorted(bases.items()):
        files = catalog.store_files(root, store)
        by_path = {f.path: f for f in files}
        for fact in loading_files([f.facts() for f in files], ref.version):
            if storage.exists(fact.path):
                continue
            record = by_path[fact.path]
            key = StoreKey(root, store)
            problem = (
                f"the catalog recorded {record.path} for version {record.version} of store "
                f"{key}, and storage no longer has it"
            )
            catalog.add_problems(key, [FoundProblem(problem, record.path, record.version)])
            lost = StateLost(
                f"batch {batch_id} of query {query_id} cannot load its state: {problem}; run "
                f"`statestore --root {root} validate`, then `statestore restore {root} "
                f"--query {query_id} --to-batch {max(batch_id - 1, 0)} --spark-checkpoint DIR` "
                "(DIR: the query's checkpointLocation; if that batch is not intact either, the "
                "command names the newest one that is), or add --allow-lost-state to start "
                "that store again from empty"
            )
            lost.store = key  # for callers (details(), telemetry); the message names it already
            return lost
    return None
