"""A restore keeps the replay of its target batch possible: an expired base that changed nothing.

The replay of the batch ``B`` a restore returns to builds on what batch ``B - 1`` committed.
In a store that batch ``B`` left unchanged, that base is the version below the target with
the target's checkpoint id: the same state (a commit that writes a file takes a fresh id).
Cleanup may have expired it while the query was further on (it deleted the delta a snapshot
of the target superseded), so the replay would fail with ``StateLost`` although the
target's snapshot holds its state. The restore, which checked that the target loads, writes
the base version its own ``<v>_<id>.snapshot`` from the target's state, verifies it and
records it (committed: the commit log names its version and id), and the rewind un-expires
that version. Nothing else changes: the retention rule, cleanup, the loader, validation and
health see an ordinary committed snapshot, which keeps loading the base and the replay's new
version after the replay's commit orphans the target's own snapshot.

It runs in the restore, not in the replay's driver: the runtime's role may neither record a
verification nor lower ``stores.expired_through`` (least privilege), and the restore is the
step that makes an expired version the base of a batch again. A base it cannot write (the
write, the load or the verification fails for good) stays expired, and its replay fails
before any task runs, as before (``runtime/loss``): the restore names it. A transient failure
(``StorageUnavailable``, any retryable error) aborts the restore before its catalog switch
instead, so a rerun completes it rather than leaving a replay that cannot run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from state_runtime.catalog import CommitEntry, FileRecord, StoreKey, StoreRecord
from state_runtime.errors import CannotLoadState, CatalogError, StateStoreError
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance.chains import Verified
from state_runtime.maintenance.fleet import Fleet
from state_runtime.redaction import get_logger
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.file_verification import expected_of, verify_file

log = get_logger(__name__)


def expired_bases(
    fleet: Fleet,
    root: str,
    targets: Mapping[StoreId, CheckpointRef],
    history: Sequence[CommitEntry],
    lost: Collection[StoreId],
) -> dict[StoreId, CheckpointRef]:
    """For each target store not ``lost``, the committed version below its target with the
    target's id (``history``: the query's commits), when that version expired."""
    committed = {(e.key.store, e.ref) for e in history}
    idle = {
        store: CheckpointRef(ref.version - 1, ref.checkpoint_id)
        for store, ref in targets.items()
        if store not in lost and ref.version >= 2 and ref.checkpoint_id is not None
    }  # version 1's base is the empty store
    idle = {store: below for store, below in idle.items() if (store, below) in committed}
    if not idle:
        return {}
    records = fleet.stores([StoreKey(root, store) for store in idle])
    expired = {r.key.store: r.expired_through for r in records}
    return {store: below for store, below in idle.items() if expired.get(store, 0) >= below.version}


def write_bases(
    fleet: Fleet,
    root: str,
    targets: Mapping[StoreId, CheckpointRef],
    bases: Mapping[StoreId, CheckpointRef],
    run_id: int,
    checked: Verified,
) -> list[StoreId]:
    """Write, verify and record each base's own snapshot from its target's state; the stores
    whose base now loads. One whose snapshot cannot be written or loaded (a non-retryable
    error) or fails verification stays expired: its replay fails as before. A catalog error
    or a retryable one (``StorageUnavailable``: an outage) propagates, so the restore aborts
    before its catalog switch and a rerun completes it."""
    if not bases:
        return []
    storage = fleet.storage(root)
    records = {r.key.store: r for r in fleet.stores([StoreKey(root, s) for s in bases])}
    reopened = []
    for store, base in sorted(bases.items()):
        target, record = targets[store], records[store]
        files = checked.store_files(fleet, record.key)
        try:
            info = _write(fleet, record, files, target, base)
        except StateStoreError as error:
            if error.retryable or isinstance(error, CatalogError):
                raise
            log.warning(
                "restore run %d: the base of %s stays expired: %s", run_id, record.key, error
            )
            continue
        if not info.bytes_written:  # the file existed: verify and record its real size
            info = dataclasses.replace(info, bytes_written=storage.size(info.path))
        problem, _ = verify_file(storage, expected_of(info))
        recorded = fleet.catalog.record_snapshot(
            root, info, run_id=run_id, verified=problem is None, problem=problem
        )
        if problem is None and recorded is None:
            reopened.append(store)
    return reopened


def _write(
    fleet: Fleet,
    record: StoreRecord,
    files: Sequence[FileRecord],
    target: CheckpointRef,
    base: CheckpointRef,
) -> CheckpointInfo:
    """``base``'s snapshot from ``target``'s state, loaded through the catalog's inventory;
    when that does not lead to a loadable chain, through a real listing (as the snapshot
    pass does)."""
    try:
        provider = fleet.provider(record, files)
        return provider.snapshot(target.version, target.checkpoint_id, as_version=base.version)
    except CannotLoadState:
        provider = fleet.provider(record, files, listed=True)
        return provider.snapshot(target.version, target.checkpoint_id, as_version=base.version)
