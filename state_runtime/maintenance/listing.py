"""Storage wrappers maintenance hands a provider.

The provider lists a store's folder to learn which snapshots and deltas exist. Maintenance
already knows that from the catalog's inventory, so it hands the provider
:class:`CatalogListedStorage`: every request but ``list`` goes to the real storage (and is
counted there), and the listing offers only the files the catalog names (a damaged snapshot
left out is never read). :class:`StagedWrites` keeps a provider's writes in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from state_runtime.catalog import FileRecord
from state_runtime.errors import FileAlreadyExists, InvalidArgument
from state_runtime.storage import DeleteResult, FileInfo, PartialWrite, Storage


class _Forwarding(Storage):
    """A storage that forwards every request to ``inner`` (and counts it there)."""

    def __init__(self, storage: Storage) -> None:
        super().__init__()
        self.inner = storage
        self.requests = storage.requests

    @property
    def uri(self) -> str:
        return self.inner.uri

    def read(self, path: str) -> bytes:
        return self.inner.read(path)

    def write_if_absent(self, path: str, data: bytes) -> None:
        self.inner.write_if_absent(path, data)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        return self.inner.list(prefix)

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        return self.inner.delete(paths)

    def partial_writes(self, folders: Sequence[str]) -> Iterator[PartialWrite]:
        return self.inner.partial_writes(folders)

    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        return self.inner.abort_partial_writes(writes)


class CatalogListedStorage(_Forwarding):
    """``storage`` with ``list`` answered from catalog records instead of the storage."""

    def __init__(self, storage: Storage, files: Iterable[FileRecord]) -> None:
        super().__init__(storage)
        self.files = [FileInfo(f.path, f.size_bytes, f.created_at) for f in files]

    def list(self, prefix: str) -> Iterator[FileInfo]:
        folder = prefix.rstrip("/") + "/"
        return iter([f for f in self.files if f.path.startswith(folder)])


class StagedWrites(_Forwarding):
    """``storage`` whose writes stay in memory (``staged``): how a repair builds a snapshot's
    bytes with the provider's own writer, to verify them before anything on storage changes.
    Reads of a staged path see the staged bytes; it never deletes."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self.staged: dict[str, bytes] = {}

    def read(self, path: str) -> bytes:
        return self.staged[path] if path in self.staged else self.inner.read(path)

    def write_if_absent(self, path: str, data: bytes) -> None:
        if path in self.staged:
            raise FileAlreadyExists("already staged", path=path)
        self.staged[path] = bytes(data)

    def exists(self, path: str) -> bool:
        return path in self.staged or self.inner.exists(path)

    def size(self, path: str) -> int:
        return len(self.staged[path]) if path in self.staged else self.inner.size(path)

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        raise InvalidArgument("staged writes never delete")

    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        raise InvalidArgument("staged writes never delete")
