"""The provider of one store identity: loads versions, caches them, hands out stores.

Loading ``(version, checkpoint_id)`` follows SPARK-49374: use ``<v>_<id>.snapshot`` when it is
present and sound, otherwise read ``<v>_<id>.delta``, follow its lineage to the newest ancestor
that is cached, has a snapshot, or is version 0, and apply the deltas in order; when a presumed
snapshot is missing or corrupt, keep tracing through that ancestor's own delta. Files of other
ids at the same version are never read.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from pyspark.sql.types import StructType

from state_runtime.checkpoint import CheckpointInfo
from state_runtime.checkpoint_format import (
    FileHeader,
    check_identity,
    checksum,
    decode,
    encode,
    gc_paused,
    now,
    rows_of,
)
from state_runtime.config import StoreConfig
from state_runtime.errors import (
    CannotLoadState,
    CheckpointFileCorrupt,
    CheckpointFileMissing,
    FileAlreadyExists,
    InvalidArgument,
    LineageBroken,
    StorageFileNotFound,
    UnexpectedVersion,
    UnknownCheckpointId,
)
from state_runtime.identity import (
    DEFAULT_STORE_NAME,
    EMPTY,
    CheckpointRef,
    FileKind,
    StoreId,
    parse_file_name,
    validate_non_negative,
)
from state_runtime.metrics import LoadMetrics, LoadSource
from state_runtime.schema import StateSchema
from state_runtime.storage import Storage, open_storage
from state_runtime.store import ReadStateStore, StateStore
from state_runtime.versions import (
    ABSENT,
    Diff,
    Key,
    StateMap,
    Value,
    VersionView,
)

IdResolver = Callable[[StoreId, int], str | None]
"""Maps (store, version) to the committed checkpoint id, e.g. from the catalog's commit log."""


@dataclass
class _File:
    """A decoded checkpoint file."""

    ref: CheckpointRef
    kind: FileKind
    path: str
    header: FileHeader
    rows: dict[Key, Value | None]


class StateStoreProvider:
    """Versions of one store: ``(root, operator id, partition id, store name)``.

    >>> provider = StateStoreProvider("/tmp/ckpt", 0, 3, key_schema="user string",
    ...                               value_schema="count bigint")  # doctest: +SKIP
    >>> store = provider.get_store(0)                                 # doctest: +SKIP
    >>> store.put(("alice",), (1,)); info = store.commit()            # doctest: +SKIP

    ``resolve_id`` answers "which id is committed for this version" when a caller loads by
    version alone; without it, a version with exactly one checkpoint id on storage is used.
    Thread-safe; one writer per store instance.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Storage,
        operator_id: int,
        partition_id: int,
        store_name: str = DEFAULT_STORE_NAME,
        *,
        key_schema: str | StructType,
        value_schema: str | StructType,
        config: StoreConfig | None = None,
        resolve_id: IdResolver | None = None,
    ) -> None:
        self.storage = root if isinstance(root, Storage) else open_storage(root)
        self.store_id = StoreId(operator_id, partition_id, store_name)
        self.schema = StateSchema.of(key_schema, value_schema)
        self.config = config or StoreConfig()
        self.resolve_id = resolve_id
        self._lock = threading.RLock()
        self._cache: OrderedDict[CheckpointRef, VersionView] = OrderedDict()
        self._known_snapshots: set[CheckpointRef] = set()

    def __repr__(self) -> str:
        return f"StateStoreProvider({self.storage.uri!r}, {self.store_id})"

    # --- public API ---------------------------------------------------------------------

    def get_store(self, version: int, checkpoint_id: str | None = None) -> StateStore:
        """A writable store based on committed ``version``; its commit writes ``version + 1``."""
        view, metrics = self._open(version, checkpoint_id)
        return StateStore(self, view, metrics)

    def get_read_store(self, version: int, checkpoint_id: str | None = None) -> ReadStateStore:
        """A read-only store at committed ``version``."""
        view, metrics = self._open(version, checkpoint_id)
        return ReadStateStore(self, view, metrics)

    def snapshot(self, version: int, checkpoint_id: str | None = None) -> CheckpointInfo:
        """Write ``<version>_<id>.snapshot`` of a committed version (idempotent).

        If the snapshot already exists it is left untouched and described as it is.
        """
        view, _ = self._open(version, checkpoint_id)
        ref = view.ref
        if ref.version == 0 or ref.checkpoint_id is None:
            raise InvalidArgument("version 0 is the empty store; it has no snapshot")
        path = self.store_id.file_path(ref.version, ref.checkpoint_id, FileKind.SNAPSHOT)
        started = time.perf_counter()
        with self._lock:
            keys, values = [], []
            for key, value in view.items():
                keys.append(key)
                values.append(value)
        header = FileHeader(
            FileKind.SNAPSHOT,
            self.store_id,
            ref.version,
            ref.checkpoint_id,
            view.lineage,
            self.schema,
            len(keys),
            view.rows,
            now(),
        )
        data = encode(header, keys, values, self.config.compression, self.config.compression_level)
        try:
            self.storage.write_if_absent(path, data)
            written = len(data)
        except FileAlreadyExists:
            data = self.storage.read(path)
            written = 0
        self._known_snapshots.add(ref)
        return CheckpointInfo(
            store=self.store_id,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            base_checkpoint_id=view.lineage[0].checkpoint_id if view.lineage else None,
            lineage=view.lineage,
            kind=FileKind.SNAPSHOT,
            path=path,
            rows=view.rows,
            file_rows=view.rows,
            bytes_written=written,
            checksum=checksum(data),
            created_at=header.created_at,
            timings_ms={"snapshot": (time.perf_counter() - started) * 1000},
        )

    def read_header(self, ref: CheckpointRef, kind: FileKind) -> FileHeader:
        """Read and verify one checkpoint file of this store; return its header."""
        found = self._read(ref, kind, LoadMetrics(), missing_ok=False)
        assert found is not None
        return found.header

    def drop_cache(self) -> None:
        """Forget every in-memory version (the next load reads files)."""
        with self._lock:
            self._cache.clear()

    @property
    def cached_versions(self) -> list[CheckpointRef]:
        with self._lock:
            return list(self._cache)

    def resolve(self, version: int, checkpoint_id: str | None = None) -> CheckpointRef:
        """The full reference of a version: the id given, the committed one, or the only one."""
        validate_non_negative(version, "version")
        if version == 0:
            if checkpoint_id is not None:
                raise InvalidArgument("version 0 is the empty store and has no checkpoint id")
            return EMPTY
        if checkpoint_id is not None:
            return CheckpointRef(version, checkpoint_id)
        if self.resolve_id is not None:
            found = self.resolve_id(self.store_id, version)
            if found is None:
                raise UnknownCheckpointId(
                    "no committed checkpoint id for this version",
                    store=self.store_id,
                    version=version,
                )
            return CheckpointRef(version, found)
        ids = {
            parsed.checkpoint_id
            for info in self.storage.list(self.store_id.directory)
            if (parsed := parse_file_name(info.path.rsplit("/", 1)[-1])) is not None
            and parsed.version == version
        }
        if len(ids) != 1:
            raise UnknownCheckpointId(
                f"cannot resolve the checkpoint id by version alone: {len(ids)} candidates on "
                "storage; pass checkpoint_id (from the commit log)",
                store=self.store_id,
                version=version,
            )
        return CheckpointRef(version, ids.pop())

    # --- used by StateStore -------------------------------------------------------------

    def lineage_for_child(self, parent: VersionView) -> tuple[CheckpointRef, ...]:
        """The lineage a new version on top of ``parent`` records: back to a presumed snapshot."""
        if parent.ref.version == 0:
            return ()
        if parent.ref in self._known_snapshots:
            return (parent.ref,)
        return ((parent.ref, *parent.lineage))[: self.config.min_deltas_for_snapshot]

    def install(
        self,
        parent: VersionView,
        changes: Diff,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        rows: int,
    ) -> VersionView:
        """Make a just-committed version the newest cached one."""
        with self._lock:
            view = parent.state_map.derive(parent, changes, ref, lineage, rows)
            self._remember(view)
            return view

    # --- loading ------------------------------------------------------------------------

    def _open(self, version: int, checkpoint_id: str | None) -> tuple[VersionView, LoadMetrics]:
        ref = self.resolve(version, checkpoint_id)
        metrics = LoadMetrics()
        started = time.perf_counter()
        with self._lock, gc_paused():
            view = self._load(ref, metrics)
        metrics.load_ms = (time.perf_counter() - started) * 1000
        return view, metrics

    def _remember(self, view: VersionView) -> None:
        self._cache[view.ref] = view
        self._cache.move_to_end(view.ref)
        while len(self._cache) > self.config.cached_versions:
            self._cache.popitem(last=False)

    def _load(self, ref: CheckpointRef, metrics: LoadMetrics) -> VersionView:
        cached = self._cache.get(ref)
        if cached is not None:
            self._cache.move_to_end(ref)
            metrics.source = LoadSource.CACHE
            return cached
        if ref == EMPTY:
            metrics.source = LoadSource.EMPTY
            view = StateMap({}, EMPTY, ()).head
            self._remember(view)
            return view
        # Warm path: a cached ancestor plus the deltas it missed; costs O(changes).
        target = None
        if self._cache:
            target = self._read(ref, FileKind.DELTA, metrics, missing_ok=True)
        if target is not None:
            try:
                rolled = self._roll_forward(target, metrics)
            except LineageBroken as e:
                # A delta the cached copy would need was cleaned up (a newer snapshot replaced
                # it): load from files instead.
                metrics.repairs.append(
                    f"cached copy cannot roll forward ({e.reason}); loaded from files"
                )
                rolled = None
            if rolled is not None:
                return rolled
        return self._load_from_files(ref, target, metrics)

    def _roll_forward(self, target: _File, metrics: LoadMetrics) -> VersionView | None:
        """Apply the deltas a cached ancestor on ``target``'s lineage missed, if there is one."""
        lineage = target.header.lineage
        for depth, ancestor in enumerate(lineage):
            base = self._cache.get(ancestor)
            if base is None:
                continue
            chain = [target] + [
                self._need_delta(r, child, metrics)
                for r, child in zip(lineage[:depth], (target.ref, *lineage), strict=False)
            ]
            metrics.source = LoadSource.ROLL_FORWARD
            return self._apply(base, chain, metrics)
        return None

    def _load_from_files(
        self, ref: CheckpointRef, target: _File | None, metrics: LoadMetrics
    ) -> VersionView:
        metrics.source = LoadSource.FILES
        names = {
            info.path.rsplit("/", 1)[-1] for info in self.storage.list(self.store_id.directory)
        }
        chain: list[_File] = []
        cur, child = ref, None
        ignored: list[CannotLoadState] = []
        try:
            while True:
                base = self._base_for(cur, names, metrics, ignored)
                if base is not None:
                    return self._apply(base, chain, metrics)
                if cur == ref and target is not None:
                    delta = target
                elif f"{cur}.{FileKind.DELTA.value}" in names:
                    delta = self._need_delta(cur, child, metrics)
                elif child is None:
                    raise UnknownCheckpointId(
                        "no delta or snapshot exists for this version and checkpoint id",
                        store=self.store_id,
                        version=cur.version,
                        checkpoint_id=cur.checkpoint_id,
                        path=self._path(cur, FileKind.DELTA),
                    )
                else:
                    raise self._missing(cur, child)
                if child is not None:
                    self._check_chain(child, delta)
                chain.append(delta)
                child = delta
                cur = delta.header.lineage[0] if delta.header.lineage else EMPTY
                if cur.version != delta.ref.version - 1:
                    raise LineageBroken(
                        f"lineage jumps from version {delta.ref.version} to {cur.version}",
                        store=self.store_id,
                        version=delta.ref.version,
                        checkpoint_id=delta.ref.checkpoint_id,
                        path=delta.path,
                    )
        except CannotLoadState as e:
            if ignored:  # the unusable snapshot is the root cause; the fallback failed too
                raise ignored[0] from e
            raise

    def _base_for(
        self,
        ref: CheckpointRef,
        names: set[str],
        metrics: LoadMetrics,
        ignored: list[CannotLoadState],
    ) -> VersionView | None:
        """A starting point at ``ref``: cached, empty, or a sound snapshot; else None.

        An unusable snapshot is recorded in ``ignored`` and the repairs, and skipped.
        """
        if ref == EMPTY:
            return StateMap({}, EMPTY, ()).head
        cached = self._cache.get(ref)
        if cached is not None:
            return cached
        if f"{ref}.{FileKind.SNAPSHOT.value}" not in names:
            return None
        try:
            snap = self._read(ref, FileKind.SNAPSHOT, metrics, missing_ok=False)
            assert snap is not None
            if snap.header.file_rows != snap.header.state_rows:
                raise CheckpointFileCorrupt(
                    f"snapshot holds {snap.header.file_rows} rows for a state of "
                    f"{snap.header.state_rows}",
                    store=self.store_id,
                    version=ref.version,
                    checkpoint_id=ref.checkpoint_id,
                    path=snap.path,
                )
        except (CheckpointFileCorrupt, UnexpectedVersion, CheckpointFileMissing) as e:
            ignored.append(e)
            metrics.repairs.append(
                f"ignored unusable snapshot {self._path(ref, FileKind.SNAPSHOT)} ({e.reason}); "
                "loaded through its deltas instead"
            )
            return None
        self._known_snapshots.add(ref)
        data = cast(dict[Key, Value], snap.rows)
        return StateMap(data, ref, snap.header.lineage).head

    def _apply(self, base: VersionView, chain: list[_File], metrics: LoadMetrics) -> VersionView:
        """Apply deltas (given newest first) on top of ``base`` as one change; cache the result.

        The deltas are composed into one diff, checking each one's row count against its
        header on the way, and installed with a single O(changes) head update.
        """
        if not chain:
            self._remember(base)
            return base
        combined: Diff = {}
        rows = base.rows
        in_base = base.get
        for delta in reversed(chain):
            for key, value in delta.rows.items():
                before = combined.get(key)
                present = in_base(key) is not None if before is None else before is not ABSENT
                if value is None:
                    combined[key] = ABSENT
                    rows -= present
                else:
                    combined[key] = value
                    rows += not present
            if rows != delta.header.state_rows:
                raise CheckpointFileCorrupt(
                    f"applying this delta gives {rows} rows, its header says "
                    f"{delta.header.state_rows}",
                    store=self.store_id,
                    version=delta.ref.version,
                    checkpoint_id=delta.ref.checkpoint_id,
                    path=delta.path,
                )
            metrics.deltas_applied += 1
        target = chain[0]
        view = base.state_map.derive(
            base,
            combined,
            target.ref,
            target.header.lineage,
            rows,
            keep_parent=base.ref in self._cache,
        )
        self._remember(view)
        return view

    # --- files --------------------------------------------------------------------------

    def _path(self, ref: CheckpointRef, kind: FileKind) -> str:
        assert ref.checkpoint_id is not None
        return self.store_id.file_path(ref.version, ref.checkpoint_id, kind)

    def _read(
        self, ref: CheckpointRef, kind: FileKind, metrics: LoadMetrics, *, missing_ok: bool
    ) -> _File | None:
        path = self._path(ref, kind)
        try:
            data = self.storage.read(path)
        except StorageFileNotFound:
            if missing_ok:
                return None
            raise CheckpointFileMissing(
                f"{kind.value} file missing",
                store=self.store_id,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=path,
            ) from None
        metrics.files_read += 1
        metrics.bytes_read += len(data)
        header, table = decode(data, path, self.store_id, ref)
        check_identity(header, self.store_id, ref, kind, path)
        pad = self.schema.check_readable(header.schema, self.store_id, path)
        rows = rows_of(table, pad)
        problem = None
        if len(rows) != header.file_rows:
            problem = f"{header.file_rows - len(rows)} duplicate keys"
        elif kind is FileKind.SNAPSHOT and table.column("value").null_count:
            problem = "a snapshot holds removals"
        if problem:
            raise CheckpointFileCorrupt(
                problem,
                store=self.store_id,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=path,
            )
        return _File(ref, kind, path, header, rows)

    def _need_delta(
        self, ref: CheckpointRef, child: _File | CheckpointRef | None, metrics: LoadMetrics
    ) -> _File:
        delta = self._read(ref, FileKind.DELTA, metrics, missing_ok=True)
        if delta is None:
            raise self._missing(ref, child)
        return delta

    def _missing(self, ref: CheckpointRef, child: _File | CheckpointRef | None) -> LineageBroken:
        needed_by = child.path if isinstance(child, _File) else str(child)
        return LineageBroken(
            f"delta needed by {needed_by} is missing and no snapshot or cached copy replaces it",
            store=self.store_id,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            path=self._path(ref, FileKind.DELTA),
        )

    def _check_chain(self, child: _File, parent: _File) -> None:
        """The child's lineage past its parent must be a prefix of the parent's lineage."""
        rest = child.header.lineage[1:]
        if parent.header.lineage[: len(rest)] != rest:
            raise LineageBroken(
                f"lineage of {child.path} disagrees with the lineage in its parent",
                store=self.store_id,
                version=parent.ref.version,
                checkpoint_id=parent.ref.checkpoint_id,
                path=parent.path,
            )
