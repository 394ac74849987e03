"""The stores maintenance works on: the catalog, each root's storage, and store providers."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Collection, Iterator, Sequence, Set
from dataclasses import dataclass, field

from state_runtime.catalog import Catalog, FileRecord, StoreKey, StoreRecord
from state_runtime.errors import CatalogError, InvalidArgument, StateStoreError
from state_runtime.identity import StoreId
from state_runtime.maintenance.listing import CatalogListedStorage, StagedWrites
from state_runtime.storage import Storage, open_storage
from state_runtime.store.checkpoint_format import read_header
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.schema_files import fetch
from state_runtime.store.schema_history import SchemaHistory

StorageOpener = Callable[[str], Storage]


def format_store_key(key: StoreKey) -> str:
    """``<root>#<operator>/<partition>/<store name>``: a store's name in the CLI and Dagster."""
    return str(key)


def parse_store_key(text: str, *, root: str | None = None) -> StoreKey:
    """The inverse of :func:`format_store_key`; with ``root``, ``text`` may be the store
    alone (``op/part/name``, as ``health`` prints it below one root)."""
    if root is not None and "#" not in text:
        text = f"{root}#{text}"
    found_root, sep, rest = text.rpartition("#")
    parts = rest.split("/")
    if not sep or not found_root or len(parts) != 3 or not all(p.isdigit() for p in parts[:2]):
        raise InvalidArgument(
            f"invalid store {rest if root else text!r}: expected "
            f"{'[<root>#]' if root else '<root>#'}<operator>/<partition>/<store name>"
        )
    return StoreKey(found_root, StoreId(int(parts[0]), int(parts[1]), parts[2]))


def canonical_root(root: str) -> str:
    """A checkpoint root as the runtime records it in the catalog: its storage URI
    (``./ckpt`` becomes ``file:///abs/ckpt``; ``s3a://b/p`` becomes ``s3://b/p``)."""
    return open_storage(root).uri


def key_set(only: Collection[StoreKey] | None) -> Set[StoreKey] | None:
    """``only`` as a set, for :meth:`Fleet.in_scope`: a run naming 20,000 stores must not
    look each up in a list (20,000 x 20,000 comparisons)."""
    return None if only is None else frozenset(only)


def default_owner() -> str:
    """Who runs maintenance, for run records and leases: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Fleet:
    """A catalog and the storage behind its roots, optionally narrowed to some roots.

    ``open_storage`` maps a root as the catalog records it to its storage (default: the
    root is a path or URI for :func:`state_runtime.storage.open_storage`).
    """

    catalog: Catalog
    roots: Sequence[str] | None = None
    open_storage: StorageOpener = open_storage
    owner: str = field(default_factory=default_owner)
    failed_roots: dict[str, str] = field(default_factory=dict)
    """Roots set aside because their storage failed (root -> why): see :meth:`set_aside`."""
    _storages: dict[str, Storage] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stores(self, only: Collection[StoreKey] | None = None) -> list[StoreRecord]:
        """The stores in scope (all roots, or ``roots``), narrowed to ``only`` if given: every
        page of :meth:`store_pages` (one way to narrow), for the callers that need them all
        (a few stores, or a listing)."""
        return [record for page in self.store_pages(key_set(only)) for record in page]

    def store_count(self, only: Set[StoreKey] | None = None) -> int:
        """How many stores :meth:`store_pages` walks, counted without listing them: those of
        ``only`` in scope, or the catalog's count below the roots in scope (a pass's progress
        total)."""
        if only is not None:
            return sum(1 for key in only if self.roots is None or key.root in self.roots)
        return self.catalog.store_census(self.roots)[0]

    def store_pages(self, only: Set[StoreKey] | None = None) -> Iterator[list[StoreRecord]]:
        """:meth:`stores`, a page of stores at a time, root by root (keyset paging: what is
        held is one page, whatever the fleet's size); pages left empty by ``only`` are
        skipped."""
        for root in self.root_names(only):
            for page in self.catalog.store_pages(root):
                found = [r for r in page if only is None or r.key in only]
                if found:
                    yield found

    def root_names(self, only: Collection[StoreKey] | None = None) -> list[str]:
        """The roots in scope: given, or every root the catalog knows (narrowed to those of
        ``only``, as :meth:`stores` narrows: a store of a root out of scope is not in it)."""
        if only is not None:
            return sorted({k.root for k in only if self.roots is None or k.root in self.roots})
        if self.roots is not None:
            return list(self.roots)
        return sorted(self.catalog.roots())

    def query_roots(self, only: Collection[StoreKey] | None = None) -> Sequence[str | None]:
        """Roots to ask the catalog about; ``[None]`` (one question for all) when unnarrowed."""
        if self.roots is None and only is None:
            return [None]
        return self.root_names(only)

    def in_scope(self, key: StoreKey, only: Set[StoreKey] | None) -> bool:
        """Whether ``key`` is in this fleet's roots and in ``only`` (a set: :func:`key_set`)."""
        if only is not None and key not in only:
            return False
        return self.roots is None or key.root in self.roots

    def storage(self, root: str) -> Storage:
        """The storage of ``root`` (opened once, shared). RootMissing if its folder is gone
        though the catalog records committed versions below it: no pass works on an empty
        place as if it were the root (cleanup would record its files deleted, validation
        call every store broken, reconciliation find nothing and report success)."""
        with self._lock:
            found = self._storages.get(root)
            if found is None:
                opened = self.open_storage(root)
                if any(r.latest.version > 0 for r in self.catalog.stores(root)):
                    opened.check_present()
                found = self._storages[root] = opened
            return found

    def open_roots(self) -> None:
        """Open the storage of every root in scope; set aside each that cannot be opened (a
        root recorded by older code that storage refuses, a missing extra, a folder gone),
        so that one bad root stops the maintenance of no other."""
        for root in self.root_names():
            try:
                self.storage(root)
            except StateStoreError as exc:
                if isinstance(exc, CatalogError):
                    raise
                self.set_aside(root, exc)

    def set_aside(self, root: str, error: StateStoreError) -> None:
        """Leave ``root`` out of the rest of this fleet's work, noting why."""
        self.failed_roots[root] = str(error)
        self.roots = [r for r in self.root_names() if r != root]

    def provider(
        self,
        record: StoreRecord,
        files: Sequence[FileRecord],
        *,
        listed: bool = False,
        staged: bool = False,
        history: SchemaHistory | None = None,
    ) -> StateStoreProvider:
        """A fresh provider for ``record`` that knows its folder from ``files`` (no LIST);
        with ``listed`` it lists the storage instead (the fallback when the catalog is off);
        with ``staged`` its writes stay in memory (its storage is a :class:`StagedWrites`).

        The schema history is ``history`` (read by the caller for many stores at once), else
        the catalog's; a store registered without schemas takes those of its newest file in
        ``files``.
        """
        storage = self.storage(record.key.root)
        store = record.key.store
        if history is None:
            history = self.catalog.schema_history(
                record.key.root, store.operator_id, store.store_name
            )
        if history is None and files:
            newest = max(files, key=lambda f: f.version)
            header = read_header(storage.read(newest.path), newest.path)
            schema = header.schema
            if schema is None and header.schema_id is not None:
                schema = fetch(storage, header.schema_id)  # a format 3 delta names it by id
            if schema is not None:
                history = SchemaHistory.of(schema)
        if history is None:
            raise InvalidArgument(f"store {record.key} has no schemas in the catalog or files")
        base: Storage = storage if listed else CatalogListedStorage(storage, files)
        return StateStoreProvider(
            StagedWrites(base) if staged else base,
            store.operator_id,
            store.partition_id,
            store.store_name,
            history=history,
        )
