"""The provider of one store identity: opens versions, caches them, hands out stores.

Loading from files lives in :mod:`state_runtime.store.loader`, writing files in
:mod:`state_runtime.store.writer`; versions in memory are :mod:`state_runtime.store.versions`.
Cached versions count against the process's memory budget (:mod:`state_runtime.store.cache`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql.types import StructType

from state_runtime.errors import InvalidArgument, SchemaMismatch, UnknownCheckpointId
from state_runtime.identity import (
    DEFAULT_STORE_NAME,
    EMPTY,
    CheckpointRef,
    FileKind,
    StoreId,
    parse_file_name,
    validate_non_negative,
)
from state_runtime.storage import Storage, open_storage
from state_runtime.store.cache import CACHE
from state_runtime.store.chain_files import unchanged
from state_runtime.store.checkpoint_format import FileHeader
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.config import StoreConfig
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.loader import VersionLoader
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.sorted_runs import Run
from state_runtime.store.state_schema import StateSchema
from state_runtime.store.state_store import ReadStateStore, StateStore
from state_runtime.store.store_metrics import LoadMetrics, LoadSource
from state_runtime.store.streamed_writer import write_snapshot_streamed
from state_runtime.store.versions import Version
from state_runtime.store.writer import CheckpointTarget, write_checkpoint

IdResolver = Callable[[StoreId, int], str | None]
"""Maps (store, version) to the committed checkpoint id, e.g. from the catalog's commit log."""


class StateStoreProvider:
    """Versions of one store: ``(root, operator id, partition id, store name)``.

    >>> provider = StateStoreProvider("/tmp/ckpt", 0, 3, key_schema="user string",
    ...                               value_schema="count bigint")  # doctest: +SKIP
    >>> store = provider.get_store(0)                                 # doctest: +SKIP
    >>> store.put(("alice",), (1,)); info = store.commit()            # doctest: +SKIP

    ``resolve_id`` answers "which id is committed for this version" when a caller loads by
    version alone; without it, a version with exactly one checkpoint id on storage is used.
    ``history`` (the catalog's schema history of the store) replaces ``key_schema`` and
    ``value_schema``: stores open under its newest schema, and files written under an older
    one are read through the planned projection (:mod:`state_runtime.store.schema_history`).
    Thread-safe; one writer per store instance.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Storage,
        operator_id: int,
        partition_id: int,
        store_name: str = DEFAULT_STORE_NAME,
        *,
        key_schema: str | StructType | None = None,
        value_schema: str | StructType | None = None,
        history: SchemaHistory | None = None,
        config: StoreConfig | None = None,
        resolve_id: IdResolver | None = None,
    ) -> None:
        self.storage = root if isinstance(root, Storage) else open_storage(root)
        self.store_id = StoreId(operator_id, partition_id, store_name)
        if history is None:
            if key_schema is None or value_schema is None:
                raise InvalidArgument("a store needs key and value schemas, or a schema history")
            history = SchemaHistory.of(StateSchema.of(key_schema, value_schema))
        elif key_schema is not None or value_schema is not None:
            raise InvalidArgument("pass key and value schemas or a schema history, not both")
        self.history = history
        self.schema = history.newest.schema
        self.config = config or StoreConfig()
        self.resolve_id = resolve_id
        self.indexer = KeyIndexer(self.schema.key_arrow, self.config.scan_prefix)
        self.checkpoints = CheckpointTarget(self.storage, self.store_id, history, self.config)
        self._lock = threading.RLock()
        self._owner = CACHE.register(self)
        self._known_snapshots: set[CheckpointRef] = set()
        owner = self._owner  # not self: the loader must not keep the provider alive
        self._loader = VersionLoader(
            self.checkpoints,
            self.indexer,
            lambda ref: CACHE.get(owner, ref),
            self._known_snapshots,
            lambda: CACHE.refs(owner),
        )

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

    def snapshot(
        self, version: int, checkpoint_id: str | None = None, *, as_version: int | None = None
    ) -> CheckpointInfo:
        """Write ``<version>_<id>.snapshot`` of a committed version (idempotent).

        With ``as_version`` (at or below ``version``) the state of ``version`` is written as
        ``<as_version>_<id>.snapshot``: the caller knows ``(as_version, id)`` is committed, so
        the versions between changed nothing and share that state (a restore gives an expired
        version its own snapshot so). If the snapshot already exists it is left untouched and
        described as it is. A version holding runs on local disk is written from them block
        by block, never whole in memory (:mod:`state_runtime.store.streamed_writer`).
        """
        ref = self.resolve(version, checkpoint_id)
        if ref.version == 0 or ref.checkpoint_id is None:
            raise InvalidArgument("version 0 is the empty store; it has no snapshot")
        below = ref.version if as_version is None else as_version
        if not 1 <= below <= ref.version:
            raise InvalidArgument(f"a snapshot of version {ref} as version {below}")
        # Written under the version's own schema, so that it still reads as written (one more
        # read, only for a store whose schema has changed).
        written = self.written_schema(ref) if len(self.history.entries) > 1 else None
        if written is not None and written != self.history.newest.schema_id:
            return self.as_of(written).snapshot(
                ref.version, ref.checkpoint_id, as_version=as_version
            )
        view, _ = self._open(ref.version, ref.checkpoint_id)
        target = CheckpointRef(below, ref.checkpoint_id)
        if target != ref:  # the state of ``ref`` under the lower version's name and lineage
            lineage = tuple(r for r in view.lineage if r.version < below)
            view = dataclasses.replace(view, ref=target, lineage=lineage)
        if any(run.on_disk for run in view.runs):
            info = write_snapshot_streamed(self.checkpoints, target, view, exists_ok=True)
        else:
            state = view.state()
            info = write_checkpoint(
                self.checkpoints,
                FileKind.SNAPSHOT,
                target,
                view.lineage,
                state.keys,
                state.values,
                view.rows,
                in_key_order=self.indexer.exact,
                exists_ok=True,
            )
        with self._lock:
            self._known_snapshots.add(target)
        return info

    def written_schema(self, ref: CheckpointRef) -> str:
        """The id of the history entry version ``ref`` was committed under (its delta's, or
        its snapshot's when the delta is gone). SchemaMismatch if the history does not know
        it (a history older than the files: reopen with the catalog's)."""
        found = self._loader.read(ref, FileKind.DELTA, LoadMetrics(), missing_ok=True)
        if found is None:
            found = self._loader.read(ref, FileKind.SNAPSHOT, LoadMetrics(), missing_ok=True)
        if found is None and self.unchanged(ref):
            return self.written_schema(CheckpointRef(ref.version - 1, ref.checkpoint_id))
        if found is None:
            found = self._loader.read(ref, FileKind.SNAPSHOT, LoadMetrics(), missing_ok=False)
        assert found is not None
        assert found.header.schema is not None
        entry = self.history.entry_of(found.header.schema_id, found.header.schema)
        if entry is None:
            raise SchemaMismatch(
                f"written under schema {found.header.schema_id} "
                f"(<{found.header.schema.describe()}>), which this store's schema history does "
                "not know",
                store=self.store_id,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=found.path,
            )
        return entry.schema_id

    def as_of(self, schema_id: str) -> StateStoreProvider:
        """A provider of this store opened under its history up to ``schema_id``: versions
        read as they were written then."""
        return StateStoreProvider(
            self.storage,
            self.store_id.operator_id,
            self.store_id.partition_id,
            self.store_id.store_name,
            history=self.history.up_to(schema_id),
            config=self.config,
            resolve_id=self.resolve_id,
        )

    def read_header(self, ref: CheckpointRef, kind: FileKind) -> FileHeader:
        """Read and verify one checkpoint file of this store; return its header."""
        found = self._loader.read(ref, kind, LoadMetrics(), missing_ok=False)
        assert found is not None
        return found.header

    def read_delta(self, ref: CheckpointRef) -> pa.Table:
        """The changes committed version ``ref`` made, read from its delta file: a ``key`` and
        a ``value`` column, the value null where the key was removed."""
        found = self._loader.read(ref, FileKind.DELTA, LoadMetrics(), missing_ok=True)
        if found is None and self.unchanged(ref):
            empty = Run.empty(self.schema.key_arrow, self.schema.value_arrow)
            return pa.table({"key": empty.keys, "value": empty.values})
        if found is None:
            found = self._loader.read(ref, FileKind.DELTA, LoadMetrics(), missing_ok=False)
        assert found is not None and isinstance(found.run, Run)  # deltas are read whole
        return pa.table({"key": found.run.keys, "value": found.run.values})

    def unchanged(self, ref: CheckpointRef) -> bool:
        """Whether version ``ref`` changed nothing and so has no file (one listing)."""
        names = {
            info.path.rsplit("/", 1)[-1] for info in self.storage.list(self.store_id.directory)
        }
        return unchanged(ref, names)

    def drop_cache(self) -> None:
        """Forget every in-memory version (the next load reads files)."""
        CACHE.drop(self._owner)

    @property
    def cached_versions(self) -> list[CheckpointRef]:
        """The versions this provider holds in memory, least recently used first."""
        return CACHE.refs(self._owner)

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

    def lineage_for_child(self, parent: Version) -> tuple[CheckpointRef, ...]:
        """The lineage a new version on top of ``parent`` records: back to a presumed snapshot."""
        if parent.ref.version == 0:
            return ()
        with self._lock:
            if parent.ref in self._known_snapshots:
                return (parent.ref,)
        return ((parent.ref, *parent.lineage))[: self.config.min_deltas_for_snapshot]

    def install(self, version: Version) -> None:
        """Make a just-committed version the newest cached one."""
        self._remember(version)

    # --- loading ------------------------------------------------------------------------

    def _open(self, version: int, checkpoint_id: str | None) -> tuple[Version, LoadMetrics]:
        ref = self.resolve(version, checkpoint_id)
        metrics = LoadMetrics()
        started = time.perf_counter()
        with self._lock:
            view = self._load(ref, metrics)
        metrics.load_ms = (time.perf_counter() - started) * 1000
        return view, metrics

    def _cached(self, ref: CheckpointRef) -> Version | None:
        return CACHE.get(self._owner, ref)

    def _remember(self, version: Version) -> None:
        CACHE.put(self._owner, version, self.config.cached_versions)

    def _load(self, ref: CheckpointRef, metrics: LoadMetrics) -> Version:
        cached = self._cached(ref)
        if cached is not None:
            metrics.source = LoadSource.CACHE
            return cached
        if ref == EMPTY:
            metrics.source = LoadSource.EMPTY
            version = self._loader.empty()
        else:
            warm = bool(CACHE.refs(self._owner))
            version = self._loader.load(ref, metrics, warm=warm)
        self._remember(version)
        return version
