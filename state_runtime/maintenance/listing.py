"""Storage whose folder listing comes from the catalog: how maintenance loads without LIST.

The provider lists a store's folder to learn which snapshots and deltas exist. Maintenance
already knows that from the catalog's inventory, so it hands the provider this wrapper: every
request but ``list`` goes to the real storage (and is counted there).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from state_runtime.catalog import FileRecord
from state_runtime.storage import DeleteResult, FileInfo, PartialWrite, Storage


class CatalogListedStorage(Storage):
    """``storage`` with ``list`` answered from catalog records instead of the storage."""

    def __init__(self, storage: Storage, files: Iterable[FileRecord]) -> None:
        super().__init__()
        self.inner = storage
        self.requests = storage.requests
        self.files = [FileInfo(f.path, f.size_bytes, f.created_at) for f in files]

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
        folder = prefix.rstrip("/") + "/"
        return iter([f for f in self.files if f.path.startswith(folder)])

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        return self.inner.delete(paths)

    def partial_writes(self, folders: Sequence[str]) -> Iterator[PartialWrite]:
        return self.inner.partial_writes(folders)

    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        return self.inner.abort_partial_writes(writes)
