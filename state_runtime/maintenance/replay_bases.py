"""A restore keeps the replay of its target batch possible: an expired base that still loads.

The replay of the batch ``B`` a restore returns to builds on what batch ``B - 1`` committed:
in each store, the version below the target. Cleanup may have expired it while the query was
further on, although its state is still there:

- in a store that batch ``B`` left unchanged, the base has the target's checkpoint id, so the
  same state; cleanup deleted the delta a snapshot of the target superseded;
- in any store, cleanup expires every version a deleted snapshot loaded, up to the next
  snapshot, while the chain below that snapshot (a delta whose later versions changed
  nothing) may still load them.

Either way the replay would fail with ``StateLost`` although the state is there. The restore
has checked that the target loads. It writes the base version its own
``<v>_<id>.snapshot``: from the target's state when the target changed nothing, else from
the base's own state as the files still load it. It verifies and records that snapshot
(committed: the commit log names its version and id), and the rewind un-expires that
version. Nothing else changes: the retention rule, cleanup, the loader, validation and
health see an ordinary committed snapshot, which keeps loading the base and the replay's new
version after the replay's commit orphans the target's own snapshot.

It runs in the restore, not in the replay's driver: the runtime's role may neither record a
verification nor lower ``stores.expired_through`` (least privilege), and the restore is the
step that makes an expired version the base of a batch again. A base it cannot write (the
base's state is gone, or the write, the load or the verification fails for good) stays
expired, and its replay fails before any task runs, as before (``runtime/loss``): the
restore names it. A transient failure (``StorageUnavailable``, any retryable error) aborts
the restore before its catalog switch instead, so a rerun completes it rather than leaving
a replay that cannot run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

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
    """For each target store not ``lost``, the committed version below its target (the
    replay's base; ``history``: the query's commits), when that version expired."""
    committed = {(e.key.store, e.ref.version): e.ref for e in history}
    below = {
        store: committed.get((store, ref.version - 1))
        for store, ref in targets.items()
        if store not in lost and ref.version >= 2
    }  # version 1's base is the empty store
    bases = {store: ref for store, ref in below.items() if ref is not None}
    if not bases:
        return {}
    records = fleet.stores([StoreKey(root, store) for store in bases])
    expired = {r.key.store: r.expired_through for r in records}
    return {store: base for store, base in bases.items() if expired.get(store, 0) >= base.version}


@dataclass
class WrittenBases:
    """What :func:`write_bases` did: the stores whose base now loads again (``reopened``),
    and those whose base changed state and no file loads any more (``gone``)."""

    reopened: list[StoreId] = field(default_factory=list)
    gone: list[StoreId] = field(default_factory=list)


def same_state(target: CheckpointRef, base: CheckpointRef) -> bool:
    """Whether the target changed nothing over its base (the same checkpoint id)."""
    return target.checkpoint_id == base.checkpoint_id


def write_bases(
    fleet: Fleet,
    root: str,
    targets: Mapping[StoreId, CheckpointRef],
    bases: Mapping[StoreId, CheckpointRef],
    run_id: int,
    checked: Verified,
) -> WrittenBases:
    """Write, verify and record each base's own snapshot (see the module). A base that
    changed state and that no file loads any more is gone: its replay fails, as a loss. One
    whose snapshot cannot be written or loaded otherwise (a non-retryable error) or fails
    verification stays expired: its replay fails as before. A catalog error or a retryable
    one (``StorageUnavailable``: an outage) propagates, so the restore aborts before its
    catalog switch and a rerun completes it."""
    written = WrittenBases()
    if not bases:
        return written
    storage = fleet.storage(root)
    records = {r.key.store: r for r in fleet.stores([StoreKey(root, s) for s in bases])}
    for store, base in sorted(bases.items()):
        target, record = targets[store], records[store]
        files = checked.store_files(fleet, record.key)
        try:
            info = _write(fleet, record, files, target, base)
        except StateStoreError as error:
            if error.retryable or isinstance(error, CatalogError):
                raise
            if isinstance(error, CannotLoadState) and not same_state(target, base):
                log.info("restore run %d: the base of %s is gone: %s", run_id, record.key, error)
                written.gone.append(store)
                continue
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
            written.reopened.append(store)
    return written


def _write(
    fleet: Fleet,
    record: StoreRecord,
    files: Sequence[FileRecord],
    target: CheckpointRef,
    base: CheckpointRef,
) -> CheckpointInfo:
    """``base``'s snapshot: from ``target``'s state when the target changed nothing (the same
    id: the same state), else from the base's own, loaded through the catalog's inventory;
    when that does not lead to a loadable chain, through a real listing (as the snapshot
    pass does)."""
    source = target if same_state(target, base) else base
    try:
        provider = fleet.provider(record, files)
        return provider.snapshot(source.version, source.checkpoint_id, as_version=base.version)
    except CannotLoadState:
        provider = fleet.provider(record, files, listed=True)
        return provider.snapshot(source.version, source.checkpoint_id, as_version=base.version)
