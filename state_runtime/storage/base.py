"""The storage interface: the only way the library touches checkpoint files.

Paths are relative, ``/``-separated and validated: no absolute paths, no ``..``, no empty
segments, so nothing can escape the root. Files are immutable: ``write_if_absent`` never
replaces an existing file, which is what lets concurrent task attempts coexist safely.
"""

from __future__ import annotations

import contextlib
import io
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from state_runtime.errors import InvalidArgument

_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_relative_path(path: str) -> str:
    """Return ``path`` if it is a safe relative path below the root, else raise InvalidArgument."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"invalid storage path {path!r}: empty")
    if path.startswith("/") or "\\" in path:
        raise InvalidArgument(f"invalid storage path {path!r}: must be relative, '/'-separated")
    for segment in path.split("/"):
        if segment in {"", ".", ".."} or not _SEGMENT_RE.match(segment):
            raise InvalidArgument(
                f"invalid storage path {path!r}: segment {segment!r} is not allowed"
            )
    return path


@dataclass(frozen=True)
class FileInfo:
    """A file found by ``list``: its path relative to the root, size and modification time."""

    path: str
    size: int
    modified: datetime


@dataclass(frozen=True)
class PartialWrite:
    """A write that never finished: a writer died between starting it and making the file
    visible. Locally a temporary file (``path`` is the temporary file), on S3 an incomplete
    multipart upload (``path`` is the file it was to become, ``handle`` the upload id).
    No listing shows it and no catalog records it."""

    path: str
    started: datetime
    size: int
    handle: str = ""
    live: bool = False
    """A writer still holds it (local: the writer's lock): it is never removed."""


@dataclass
class DeleteResult:
    """What a batch delete did: the paths deleted (or already absent) and those that failed."""

    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestCounter:
    """Counts storage requests by kind, for request accounting in tests and benchmarks."""

    counts: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0

    def add(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n

    def reset(self) -> None:
        self.counts.clear()
        self.bytes_read = 0
        self.bytes_written = 0


class ByteStream(Protocol):
    """A file being read front to back: ``read(n)`` gives up to ``n`` bytes, b"" at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


class Storage(ABC):
    """A root below which checkpoint files are read and written.

    Implementations: :class:`~state_runtime.storage.local.LocalStorage` and
    :class:`~state_runtime.storage.s3.S3Storage`. Use :func:`state_runtime.storage.open_storage`
    to get one from a URI.
    """

    def __init__(self) -> None:
        self.requests = RequestCounter()

    @property
    @abstractmethod
    def uri(self) -> str:
        """The root as a URI (``file:///...`` or ``s3://bucket/prefix``), without credentials."""

    def check_present(self) -> None:
        """Raise RootMissing if the root itself is gone (a local folder moved, unmounted or
        deleted). An S3 prefix is no object of its own: nothing to check."""
        return

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The whole file. Raises StorageFileNotFound if it does not exist."""

    def read_stream(self, path: str) -> AbstractContextManager[ByteStream]:
        """The file as a stream read in pieces, so that a large file never sits whole in
        memory (local: the open file; S3: the GetObject body). Raises StorageFileNotFound if
        it does not exist, StorageError if reading fails. This default reads it whole."""
        return contextlib.nullcontext(io.BytesIO(self.read(path)))

    @abstractmethod
    def write_if_absent(self, path: str, data: bytes) -> None:
        """Create the file atomically with ``data``; raise FileAlreadyExists if it exists.

        A reader sees either no file or the complete file, never a partial one.
        """

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        """:meth:`write_if_absent` of the ``size`` bytes ``source`` gives, read in pieces so
        that a large file never sits whole in memory (local: copied into the temporary file;
        S3: a multipart upload of parts read one by one). This default reads it whole."""
        self.write_if_absent(path, source.read(size))

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the file exists."""

    @abstractmethod
    def size(self, path: str) -> int:
        """The file's size in bytes. Raises StorageFileNotFound if it does not exist."""

    @abstractmethod
    def list(self, prefix: str) -> Iterator[FileInfo]:
        """Every file below the folder ``prefix`` (recursively), in no particular order."""

    @abstractmethod
    def delete(self, paths: Sequence[str]) -> DeleteResult:
        """Delete files; a path that is already absent counts as deleted."""

    @abstractmethod
    def partial_writes(self, folders: Sequence[str]) -> Iterator[PartialWrite]:
        """The unfinished writes below any of ``folders`` (recursively), found the way that
        is cheapest for the backend (S3: one listing of uploads under their common prefix)."""

    @abstractmethod
    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        """Remove unfinished writes (their ``path`` in the result); one already gone counts
        as removed, one a live writer turns out to hold is left alone and in neither list.
        Never touches a finished file."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
