"""Reading a version from checkpoint files: the SPARK-49374 chain walk, verification, repairs.

Loading ``(version, checkpoint_id)``: use ``<v>_<id>.snapshot`` when it is present and sound,
otherwise read ``<v>_<id>.delta``, follow its lineage to the newest ancestor that is cached,
has a snapshot, or is version 0, and apply the deltas in order; when a presumed snapshot is
missing or corrupt, keep tracing through that ancestor's own delta. Files of other ids at the
same version are never read. Every file is verified (envelope, checksum, layout, identity,
schema, duplicate keys, row counts) before any of it is used.

A cold load lists the store's folder once. Maintenance may meanwhile write a newer snapshot
and delete the deltas it replaces; a load that finds a file gone, or finds no file at all
for the version in a listing the folder no longer matches (a listing is not a point in time),
re-lists and walks again (at most :data:`LOAD_ATTEMPTS` times), so a retained version always
loads.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa

from state_runtime.errors import (
    CannotLoadState,
    CheckpointFileCorrupt,
    CheckpointFileMissing,
    LineageBroken,
    SchemaMismatch,
    StorageFileNotFound,
    UnexpectedVersion,
    UnknownCheckpointId,
)
from state_runtime.identity import EMPTY, CheckpointRef, FileKind
from state_runtime.storage.base import ByteStream
from state_runtime.store.chain_files import (
    ChainFile,
    CheckpointFile,
    lineage_of,
    parent_of,
    unchanged,
)
from state_runtime.store.checkpoint_format import (
    DELTA_FORMAT_VERSION,
    ENVELOPE_SIZE,
    FileHeader,
    check_identity,
    check_rows,
    corrupt_reporter,
    decode,
    decode_compact_rows,
    format_of,
    labelled,
    parse_compact_rows,
)
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_levels import AnyRun
from state_runtime.store.schema_evolution import Projection
from state_runtime.store.snapshot_stream import (
    decodes_large,
    opened_whole,
    read_streamed,
    streams,
)
from state_runtime.store.sorted_runs import Run
from state_runtime.store.store_metrics import LoadMetrics, LoadSource
from state_runtime.store.tiny_deltas import TinyDelta, is_tiny, runs_together
from state_runtime.store.versions import Version, counted_union, squash
from state_runtime.store.writer import CheckpointTarget

_Fault = TypeVar("_Fault", bound=CannotLoadState)
_T = TypeVar("_T")

LOAD_ATTEMPTS = 4
"""Listings a cold load makes at most when files vanish under it (maintenance at work)."""


class _Vanished(Exception):
    """A file the walk expected was gone: list again."""

    def __init__(self, error: CannotLoadState) -> None:
        super().__init__(error.reason)
        self.error = error


class VersionLoader:
    """Loads versions of one store from its files, building on cached versions when it can."""

    def __init__(
        self,
        target: CheckpointTarget,
        indexer: KeyIndexer,
        cached: Callable[[CheckpointRef], Version | None],
        known_snapshots: set[CheckpointRef],
        cached_refs: Callable[[], list[CheckpointRef]] = list,
    ) -> None:
        self.target = target
        self.store = target.store
        self.schema = target.schema
        self.indexer = indexer
        self._cached = cached
        self._cached_refs = cached_refs
        self._known_snapshots = known_snapshots

    def empty(self) -> Version:
        return Version.of(
            self.indexer,
            Run.empty(self.schema.key_arrow, self.schema.value_arrow),
            EMPTY,
            (),
            self.store,
        )

    def load(self, ref: CheckpointRef, metrics: LoadMetrics, *, warm: bool) -> Version:
        """Version ``ref`` (not cached): rolled forward from a cached ancestor if ``warm`` and
        one is on its lineage, else from files (also when a delta the roll forward needs is
        unusable: a load from files reads a version's snapshot before its delta, so a warm
        load fails only where a cold one does)."""
        target = None
        if warm:
            same = self._cached_unchanged(ref)
            if same is not None:  # a version without a file, on top of a cached one
                metrics.source = LoadSource.ROLL_FORWARD
                return self._relabel(same, ref)
            try:
                target = self.read(ref, FileKind.DELTA, metrics, missing_ok=True)
                rolled = None if target is None else self._roll_forward(target, metrics)
            except CannotLoadState as e:
                # A delta the cached copy would need was cleaned up (a newer snapshot replaced
                # it) or is unusable (corrupt): the files may hold the version without it (a
                # snapshot of it or of an ancestor, which a load from files reads first).
                where = f"{e.path}: " if e.path else ""
                metrics.repairs.append(
                    f"cached copy cannot roll forward ({where}{e.reason}); loaded from files"
                )
                rolled = None
            if rolled is not None:
                return rolled
        metrics.source = LoadSource.FILES
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            try:
                return self._load_from_files(ref, target, metrics)
            except _Vanished as vanished:
                if attempt == LOAD_ATTEMPTS:
                    raise vanished.error from None
                metrics.repairs.append(
                    f"{vanished.error.path} vanished while loading ({vanished.error.reason}); "
                    "listed the files again"
                )
                target = None  # read everything afresh
        raise AssertionError("unreachable")

    def _roll_forward(self, target: CheckpointFile, metrics: LoadMetrics) -> Version | None:
        """Apply the deltas a cached ancestor on ``target``'s lineage missed, if there is one.

        The walk goes parent by parent (a format 3 delta names only its parent), reading
        deltas only when a cached version lies within the lineage's depth. A parent without a
        delta may be a version that changed nothing: the walk goes on below it with the same
        id and accepts it only on reaching that id at a lower version (a cached copy or a
        delta), which proves it (a commit that writes a file takes a fresh id)."""
        depth = target.header.depth
        lowest = target.ref.version - depth
        if not any(lowest <= r.version < target.ref.version for r in self._cached_refs()):
            return None
        chain = [target]
        parent = parent_of(target)
        missing: CheckpointRef | None = None  # a delta not found: unchanged, or cleaned up
        while True:
            base = self._cached(parent) or self._cached_unchanged(parent)
            if base is not None:
                metrics.source = LoadSource.ROLL_FORWARD
                return self.apply(self._relabel(base, parent), chain, metrics)
            if parent.version <= lowest:
                if missing is not None:
                    raise self._missing(missing, chain[-1])
                return None
            delta = self.read(parent, FileKind.DELTA, metrics, missing_ok=True)
            if delta is None:
                missing = missing or parent
                parent = CheckpointRef(parent.version - 1, parent.checkpoint_id)
                continue
            missing = None  # the same id at a lower version: the versions above changed nothing
            self._check_chain(chain[-1], delta)
            chain.append(delta)
            parent = parent_of(delta)

    def _cached_unchanged(self, ref: CheckpointRef) -> Version | None:
        """A cached version with ``ref``'s id at a lower version: ``ref`` changed nothing
        since (ids of versions with files are fresh), so its state is that one."""
        same = [r for r in self._cached_refs() if r.checkpoint_id == ref.checkpoint_id]
        below = [r for r in same if r.version < ref.version]
        return self._cached(max(below)) if below else None

    def _relabel(self, version: Version, ref: CheckpointRef) -> Version:
        """``version`` as ``ref``, a later version without a file (same id, same state)."""
        if version.ref == ref:
            return version
        hops = [
            CheckpointRef(v, ref.checkpoint_id)
            for v in range(ref.version - 1, version.ref.version - 1, -1)
        ]
        lineage = (*hops, *version.lineage)[: self.target.config.min_deltas_for_snapshot]
        return dataclasses.replace(version, ref=ref, lineage=lineage)

    def _load_from_files(
        self, ref: CheckpointRef, target: CheckpointFile | None, metrics: LoadMetrics
    ) -> Version:
        names = {
            info.path.rsplit("/", 1)[-1] for info in self.target.storage.list(self.store.directory)
        }
        chain: list[ChainFile] = []
        cur: CheckpointRef = ref
        child: ChainFile | None = None
        ignored: list[CannotLoadState] = []
        decoding = False  # the walk's end: its tiny deltas decoded, their fault raised as is
        try:
            while True:
                base = self._base_for(cur, names, metrics, ignored)
                if base is not None:
                    decoding = True
                    return self._relabel(self.apply(base, self._decoded(chain), metrics), ref)
                delta: ChainFile
                if cur == ref and target is not None:
                    delta = target
                elif f"{cur}.{FileKind.DELTA.value}" in names:
                    delta = self._need_delta(cur, child, metrics)
                elif unchanged(cur, names):  # no file: its state is its parent's
                    # (asked only without a delta: it parses every name of the folder)
                    cur = CheckpointRef(cur.version - 1, cur.checkpoint_id)
                    continue
                elif child is None:
                    raise self._fault(
                        UnknownCheckpointId,
                        "no delta or snapshot exists for this version and checkpoint id",
                        cur,
                        self._path(cur, FileKind.DELTA),
                    )
                else:
                    raise self._missing(cur, child)
                chain.append(delta)  # first: a fault in its rows precedes its lineage's
                if child is not None:
                    self._check_chain(child, delta)
                child = delta
                cur = parent_of(delta)
                if cur.version != delta.ref.version - 1:
                    raise self._fault(
                        LineageBroken,
                        f"lineage jumps from version {delta.ref.version} to {cur.version}",
                        delta.ref,
                        delta.path,
                    )
        except CannotLoadState as e:
            # A whole read of each file would have stopped at the first faulty one: a tiny
            # delta's rows, decoded only now, come before what the walk found after it.
            fault = e if decoding else self._earlier_fault(chain) or e
            # A listing is not a point in time: a file deleted after the folder was read is
            # skipped, and one written meanwhile is not seen, so a snapshot that replaced the
            # version's delta can be missing from a listing that also lost the delta.
            if isinstance(
                fault, (LineageBroken, CheckpointFileMissing, UnknownCheckpointId)
            ) and self._vanished(fault, names):
                raise _Vanished(fault) from fault
            if ignored:  # the unusable snapshot is the root cause; the fallback failed too
                raise ignored[0] from fault
            if fault is e:
                raise
            raise fault from e

    def _decoded(self, chain: list[ChainFile]) -> list[CheckpointFile]:
        """The chain's files with their runs: its tiny deltas decoded together, or, when
        that fails, each alone in the walk's order (raising as a whole read of each would)."""
        tiny = [f for f in chain if isinstance(f, TinyDelta)]
        runs = runs_together(self.indexer, tiny) if tiny else []
        if runs is None:
            return [f if isinstance(f, CheckpointFile) else self._alone(f) for f in chain]
        made = iter(runs)
        return [
            f
            if isinstance(f, CheckpointFile)
            else CheckpointFile(f.ref, f.kind, f.path, f.header, next(made))
            for f in chain
        ]

    def _earlier_fault(self, chain: list[ChainFile]) -> CannotLoadState | None:
        """The fault of the first of the chain's tiny deltas whose rows do not decode."""
        try:
            self._decoded(chain)
        except CannotLoadState as e:
            return e
        return None

    def _vanished(self, error: CannotLoadState, names: set[str]) -> bool:
        """Whether ``error`` is about a file that is gone, or the listing is out of date."""
        if isinstance(error, CheckpointFileMissing):
            return True
        listed = {
            info.path.rsplit("/", 1)[-1] for info in self.target.storage.list(self.store.directory)
        }
        return listed != names

    def _base_for(
        self,
        ref: CheckpointRef,
        names: set[str],
        metrics: LoadMetrics,
        ignored: list[CannotLoadState],
    ) -> Version | None:
        """A starting point at ``ref``: cached, empty, or a sound snapshot; else None.

        An unusable snapshot is recorded in ``ignored`` and the repairs, and skipped.
        """
        if ref == EMPTY:
            return self.empty()
        cached = self._cached(ref)
        if cached is not None:
            return cached
        if f"{ref}.{FileKind.SNAPSHOT.value}" not in names:
            return None
        try:
            snap = self.read(ref, FileKind.SNAPSHOT, metrics, missing_ok=False)
            assert snap is not None
            if snap.header.file_rows != snap.header.state_rows:
                raise self._fault(
                    CheckpointFileCorrupt,
                    f"snapshot holds {snap.header.file_rows} rows for a state of "
                    f"{snap.header.state_rows}",
                    ref,
                    snap.path,
                )
        except (CheckpointFileCorrupt, UnexpectedVersion, CheckpointFileMissing) as e:
            ignored.append(e)
            metrics.repairs.append(
                f"ignored unusable snapshot {self._path(ref, FileKind.SNAPSHOT)} ({e.reason}); "
                "loaded through its deltas instead"
            )
            return None
        self._known_snapshots.add(ref)
        return Version.of(self.indexer, snap.run, ref, snap.header.lineage, self.store)

    def apply(self, base: Version, chain: list[CheckpointFile], metrics: LoadMetrics) -> Version:
        """Apply deltas (given newest first) on top of ``base`` as one change.

        The row count is the newest delta's header's. Each file's bytes are verified when read
        and its parent by :meth:`_check_chain`; when every run is in memory, each delta's count
        is also checked against one sorted union of the chain (:func:`counted_union`, cheap),
        which also gives the chain squashed (of more than two runs, as :func:`squash` would).
        With runs on local disk that recount would be a batch lookup of every delta's keys in
        the runs on disk, about as much as a batch itself in every roll forward and cold load,
        so there the header's count is taken, as Spark's providers take theirs. A first delta
        on disk over nothing, without removals, is taken as the base (it is the state at its
        version), so a cold load does not write the state again to local disk."""
        if not chain:
            return base
        lineage, target = lineage_of(chain, base), chain[0]
        metrics.deltas_applied += len(chain)
        oldest = chain[-1].run
        if len(chain) > 1 and oldest.on_disk and not oldest.removals and base.rows == 0:
            # The first delta over nothing is a state as read: it becomes the base, not a run
            # merged with the later deltas (that merge rewrote the whole state on local disk
            # at every cold load of a store that was never snapshotted).
            base = Version.of(self.indexer, oldest, chain[-1].ref, (), self.store)
            chain = chain[:-1]
        in_memory = [delta.run for delta in reversed(chain) if isinstance(delta.run, Run)]
        squashed = None
        if len(in_memory) == len(chain) and all(isinstance(run, Run) for run in base.runs):
            squashed = self._check_rows(base, chain[::-1], in_memory)
        runs, empty = [delta.run for delta in chain], not any(len(run) for run in base.runs)
        changes: AnyRun
        if squashed is not None and len(chain) > 2:
            changes = squashed
        else:  # squash merges two runs, or runs on disk
            changes = squash(self.indexer, runs, self.store, over_nothing=empty)
        return base.derive(changes, target.ref, lineage, target.header.state_rows)

    def _check_rows(
        self, base: Version, oldest_first: list[CheckpointFile], deltas: list[Run]
    ) -> Run | None:
        """Each delta's row count (oldest first) against its header, counted from one union of
        the chain's runs, all in memory; the chain squashed from that union, when it can be
        (:func:`counted_union`), which :func:`squash` would sort again."""
        rows = base.rows
        counts, squashed = counted_union(self.indexer, base.runs, deltas, squash=True)
        for delta, change in zip(oldest_first, counts, strict=True):
            rows += int(change)
            if rows != delta.header.state_rows:
                raise self._fault(
                    CheckpointFileCorrupt,
                    f"applying this delta gives {rows} rows, its header says "
                    f"{delta.header.state_rows}",
                    delta.ref,
                    delta.path,
                )
        return squashed

    # --- files --------------------------------------------------------------------------

    def _fault(self, error: type[_Fault], reason: str, ref: CheckpointRef, path: str) -> _Fault:
        """``error`` about one file of this store, naming store, version, id and path."""
        return error(
            reason,
            store=self.store,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            path=path,
        )

    def _path(self, ref: CheckpointRef, kind: FileKind) -> str:
        assert ref.checkpoint_id is not None
        return self.store.file_path(ref.version, ref.checkpoint_id, kind)

    def read(
        self, ref: CheckpointRef, kind: FileKind, metrics: LoadMetrics, *, missing_ok: bool
    ) -> CheckpointFile | None:
        """Read and verify one checkpoint file of this store (None if absent and allowed)."""
        found = self._read(ref, kind, metrics, missing_ok=missing_ok, tiny=False)
        assert not isinstance(found, TinyDelta)
        return found

    def _read(
        self,
        ref: CheckpointRef,
        kind: FileKind,
        metrics: LoadMetrics,
        *,
        missing_ok: bool,
        tiny: bool,
    ) -> ChainFile | None:
        """:meth:`read`; with ``tiny``, a tiny delta verified and its rows parsed but not
        decoded (:mod:`state_runtime.store.tiny_deltas`)."""
        path = self._path(ref, kind)
        try:
            with self.target.storage.read_stream(path) as stream:
                head = stream.read(ENVELOPE_SIZE)
                if streams(head):
                    return self._read_streamed(ref, kind, path, head, stream, metrics)
                data = head + stream.read()
            opened = opened_whole(data)
            if decodes_large(opened):  # a small file of many rows: streamed from its bytes
                payload = io.BytesIO(memoryview(data)[ENVELOPE_SIZE:])
                return self._read_streamed(ref, kind, path, head, payload, metrics)
        except StorageFileNotFound:
            if missing_ok:
                return None
            raise self._fault(
                CheckpointFileMissing, f"{kind.value} file missing", ref, path
            ) from None
        metrics.files_read += 1
        metrics.bytes_read += len(data)
        store, schema_of = self.store, self.target.schema_of
        if format_of(data) != DELTA_FORMAT_VERSION:
            header, table = self._schema_known(
                ref, path, lambda: decode(data, path, store, ref, schema_of, opened)
            )
            return self._from_rows(ref, kind, path, header, table)
        header, parsed, stored = self._schema_known(
            ref, path, lambda: parse_compact_rows(data, path, store, ref, schema_of)
        )
        delta = TinyDelta(ref, kind, path, header, stored, parsed.encodings, None)
        if tiny and is_tiny(header) and labelled(header, self.store, ref, kind):
            try:
                return dataclasses.replace(delta, projection=self._projection(ref, path, header))
            except SchemaMismatch:
                pass  # read whole: its rows' faults come first
        return self._alone(delta)

    def _schema_known(self, ref: CheckpointRef, path: str, decoding: Callable[[], _T]) -> _T:
        """``decoding()``, a SchemaMismatch naming the store's schema too."""
        try:
            return decoding()
        except SchemaMismatch as e:
            newest = self.target.history.newest.schema.describe()
            raise SchemaMismatch(
                f"{e.reason}; the store's schema is <{newest}>",
                store=self.store,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=path,
            ) from None

    def _alone(self, delta: TinyDelta) -> CheckpointFile:
        """A format 3 file's parsed rows decoded on their own, verified, as a run."""
        corrupt = corrupt_reporter(delta.path, self.store, delta.ref)
        table = decode_compact_rows(delta.header, delta.encodings, delta.stored, corrupt)
        check_rows(delta.header, table, corrupt)
        return self._from_rows(delta.ref, delta.kind, delta.path, delta.header, table)

    def _from_rows(
        self, ref: CheckpointRef, kind: FileKind, path: str, header: FileHeader, table: pa.Table
    ) -> CheckpointFile:
        """A decoded file's identity checked and its rows, under the store's schema, as a run
        (duplicate keys, and removals in a snapshot, refused)."""
        check_identity(header, self.store, ref, kind, path)
        keys, values = self._projection(ref, path, header).apply(
            table.column("key").combine_chunks(), table.column("value").combine_chunks()
        )
        run, duplicates = Run.build(self.indexer, keys, values)
        problem = None
        if duplicates:
            problem = f"{duplicates} duplicate keys"
        elif kind is FileKind.SNAPSHOT and run.removals:
            problem = "a snapshot holds removals"
        if problem:
            raise self._fault(CheckpointFileCorrupt, problem, ref, path)
        return CheckpointFile(ref, kind, path, header, run)

    def _projection(self, ref: CheckpointRef, path: str, header: FileHeader) -> Projection:
        """How rows of a file written under ``header``'s schema read under the store's schema:
        the one place a whole read and a streamed one widen rows."""
        assert header.schema is not None
        try:
            projection = self.target.history.projection(header.schema_id, header.schema)
        except SchemaMismatch as e:
            raise SchemaMismatch(
                f"cannot read this file under the store's schema: {e.reason}",
                store=self.store,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=path,
            ) from None
        return projection

    def _read_streamed(
        self,
        ref: CheckpointRef,
        kind: FileKind,
        path: str,
        head: bytes,
        stream: ByteStream,
        metrics: LoadMetrics,
    ) -> CheckpointFile:
        """A large file read a batch at a time into a run (on local disk once it outgrows
        the spill threshold): :mod:`state_runtime.store.snapshot_stream`."""
        header, run, size = read_streamed(
            head,
            stream,
            kind=kind,
            path=path,
            store=self.store,
            ref=ref,
            indexer=self.indexer,
            project=lambda header: self._projection(ref, path, header),
        )
        metrics.files_read += 1
        metrics.bytes_read += size
        return CheckpointFile(ref, kind, path, header, run)

    def _need_delta(
        self, ref: CheckpointRef, child: ChainFile | None, metrics: LoadMetrics
    ) -> ChainFile:
        delta = self._read(ref, FileKind.DELTA, metrics, missing_ok=True, tiny=True)
        if delta is None:
            raise self._missing(ref, child)
        return delta

    def _missing(
        self, ref: CheckpointRef, child: ChainFile | CheckpointRef | None
    ) -> LineageBroken:
        needed_by = child.path if isinstance(child, CheckpointFile | TinyDelta) else str(child)
        return self._fault(
            LineageBroken,
            f"delta needed by {needed_by} is missing and no snapshot or cached copy replaces it",
            ref,
            self._path(ref, FileKind.DELTA),
        )

    def _check_chain(self, child: ChainFile, parent: ChainFile) -> None:
        """The child's lineage past its parent (and the versions without a file between them)
        must be a prefix of the parent's lineage, as far as the parent records it: a format 3
        delta records only its own parent."""
        rest = child.header.lineage[child.ref.version - parent.ref.version :]
        known = parent.header.lineage
        if parent.header.lineage_depth is not None:
            rest = rest[: len(known)]
        if known[: len(rest)] != rest:
            raise self._fault(
                LineageBroken,
                f"lineage of {child.path} disagrees with the lineage in its parent",
                parent.ref,
                parent.path,
            )
