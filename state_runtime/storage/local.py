"""Checkpoint files on a local (or locally mounted) filesystem."""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from state_runtime.errors import (
    FileAlreadyExists,
    InvalidArgument,
    RootMissing,
    StorageError,
    StorageFileNotFound,
)
from state_runtime.storage.base import (
    ByteStream,
    DeleteResult,
    FileInfo,
    PartialWrite,
    Storage,
    check_relative_path,
)
from state_runtime.storage.root_rule import check_local_root

TEMP_PREFIX, TEMP_SUFFIX = ".tmp-", ".part"
"""A write's temporary file, ``.tmp-<random>.part``, next to the file it becomes."""
COPY_BYTES = 1 << 20
"""A streamed write copies its source in pieces of this size."""


class LocalStorage(Storage):
    """Files below a local directory.

    Writes go to a temporary file in the target folder, are fsynced, then hard-linked to
    the final name: ``link`` fails if the name exists, so nothing is ever replaced, and a
    reader never sees a partial file. The folder is fsynced so the new name survives a crash.
    A writer killed in between leaves its temporary file: ``list`` hides it,
    ``partial_writes`` finds it (maintenance removes it once old enough). A writer holds an
    exclusive ``flock`` on its temporary file from creation until the file is linked and its
    temporary name removed, so a sweep can tell a live write (``PartialWrite.live``) from a
    dead writer's leftover, whatever its age; the kernel drops the lock when a writer dies.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        raw = check_local_root(os.fspath(root))
        self.root = Path(raw).expanduser().absolute()
        self._root = os.fspath(self.root)

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def check_present(self) -> None:
        if not self.root.is_dir():
            raise RootMissing(
                f"checkpoint root {self.uri}: folder {self.root} does not exist (moved, "
                "unmounted or deleted?)"
            )

    def _abs(self, path: str) -> Path:
        return Path(self._abs_str(path))

    def _abs_str(self, path: str) -> str:
        """:meth:`_abs` as a string: what the per-file calls (read, delete) open, without
        pathlib parsing (and interning) every path's parts, most of a tiny file's own cost."""
        return os.path.join(self._root, check_relative_path(path))

    def read(self, path: str) -> bytes:
        self.requests.add("read")
        try:
            with open(self._abs_str(path), "rb") as file:
                data = file.read()
        except FileNotFoundError as e:
            raise StorageFileNotFound("file not found", path=path) from e
        except OSError as e:
            raise StorageError(f"cannot read: {e.strerror}", path=path) from e
        self.requests.bytes_read += len(data)
        return data

    @contextmanager
    def read_stream(self, path: str) -> Iterator[ByteStream]:
        self.requests.add("read")
        try:
            file = open(self._abs_str(path), "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError as e:
            raise StorageFileNotFound("file not found", path=path) from e
        except OSError as e:
            raise StorageError(f"cannot read: {e.strerror}", path=path) from e
        with file:
            yield _Counted(file, self, path)

    def write_if_absent(self, path: str, data: bytes) -> None:
        self._write(path, lambda f: f.write(data), len(data))

    def write_stream_if_absent(self, path: str, source: ByteStream, size: int) -> None:
        def copy(f: BinaryIO) -> None:
            left = size
            while left and (piece := source.read(min(left, COPY_BYTES))):
                f.write(piece)
                left -= len(piece)

        self._write(path, copy, size)

    def _write(self, path: str, fill: Callable[[BinaryIO], object], size: int) -> None:
        """Create the file with what ``fill`` writes, atomically (see the class)."""
        self.requests.add("write")
        target = self._abs(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = _locked_temporary(target.parent, path)
        except OSError as e:
            raise StorageError(f"cannot create temporary file: {e.strerror}", path=path) from e
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
                try:
                    os.link(tmp, target)
                except FileExistsError as e:
                    raise FileAlreadyExists("file already exists; not replaced", path=path) from e
                except OSError as e:
                    if e.errno not in {errno.EPERM, errno.ENOTSUP, errno.EXDEV}:
                        raise
                    # Filesystems without hard links: rename without replacing.
                    os.rename(tmp, target) if not target.exists() else _raise_exists(path)
                Path(tmp).unlink(missing_ok=True)
                self._fsync_dir(target.parent)
        except OSError as e:
            raise StorageError(f"cannot write: {e.strerror}", path=path) from e
        finally:
            Path(tmp).unlink(missing_ok=True)
        self.requests.bytes_written += size

    @staticmethod
    def _fsync_dir(folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        self.requests.add("exists")
        return self._abs(path).is_file()

    def size(self, path: str) -> int:
        self.requests.add("size")
        try:
            return self._abs(path).stat().st_size
        except FileNotFoundError as e:
            raise StorageFileNotFound("file not found", path=path) from e

    def list(self, prefix: str) -> Iterator[FileInfo]:
        self.requests.add("list")
        return self._walk(prefix, temporary=False)

    def partial_writes(self, folders: Sequence[str]) -> Iterator[PartialWrite]:
        for folder in dict.fromkeys(folders):
            self.requests.add("partial_writes")
            for info in self._walk(folder, temporary=True):
                live = _locked(self._abs(info.path))
                yield PartialWrite(info.path, info.modified, info.size, live=live)

    def abort_partial_writes(self, writes: Sequence[PartialWrite]) -> DeleteResult:
        for write in writes:
            if not _is_temporary(write.path.rsplit("/", 1)[-1]):
                raise InvalidArgument(f"not a temporary file: {write.path!r}", path=write.path)
        result = DeleteResult()
        for write in writes:
            full = self._abs(write.path)
            try:
                fd = os.open(full, os.O_RDONLY)
            except FileNotFoundError:
                result.deleted.append(write.path)
                continue
            except OSError as e:
                result.failed[write.path] = e.strerror or str(e)
                continue
            try:  # remove it only while holding the writer's lock: no live writer owns it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                full.unlink(missing_ok=True)
                result.deleted.append(write.path)
            except BlockingIOError:
                pass  # a live writer locked it since it was listed: not a leftover
            except OSError as e:
                result.failed[write.path] = e.strerror or str(e)
            finally:
                os.close(fd)
        return result

    def _walk(self, prefix: str, *, temporary: bool) -> Iterator[FileInfo]:
        """Files below ``prefix``: the temporary ones of unfinished writes, or the others."""
        # strings, not paths: pathlib interns every part it parses, and a fleet-wide pass
        # listing each store would churn the interpreter's table of interned strings (a
        # resize of it is megabytes: test_fleet_memory measured it as the pass's growth)
        base = os.path.join(self.root, check_relative_path(prefix))
        if os.path.isdir(base):
            yield from _scan(base, os.path.relpath(base, self.root), temporary)

    def delete(self, paths: Sequence[str]) -> DeleteResult:
        self.requests.add("delete")
        result = DeleteResult()
        for path in paths:
            try:
                os.unlink(self._abs_str(path))
            except FileNotFoundError:
                pass  # already gone: deleted
            except OSError as e:
                result.failed[path] = e.strerror or str(e)
                continue
            result.deleted.append(path)
        return result


def _scan(folder: str, relative: str, temporary: bool) -> Iterator[FileInfo]:
    """The files below ``folder`` (``relative`` to the root), as ``os.walk`` finds them (top
    down, symlinked folders not followed, unreadable folders skipped), each path built from
    its folder's: validation lists every store's folder, and a ``relpath`` and a ``join`` per
    file were most of a listing's cost."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    folders = []
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        path = entry.name if relative == "." else f"{relative}/{entry.name}"
        if is_dir:
            if not entry.is_symlink():
                folders.append((entry.path, path))
            continue
        if _is_temporary(entry.name) != temporary:
            continue
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue  # deleted while listing
        yield FileInfo(
            path=path, size=st.st_size, modified=datetime.fromtimestamp(st.st_mtime, UTC)
        )
    for below, path in folders:
        yield from _scan(below, path, temporary)


class _Counted:
    """A local file read in pieces, its bytes counted as read and its errors typed."""

    def __init__(self, file: ByteStream, storage: LocalStorage, path: str) -> None:
        self._file, self._storage, self._path = file, storage, path

    def read(self, size: int = -1, /) -> bytes:
        try:
            data = self._file.read(size)
        except OSError as e:
            raise StorageError(f"cannot read: {e.strerror}", path=self._path) from e
        self._storage.requests.bytes_read += len(data)
        return data


def _locked_temporary(folder: Path, path: str, attempts: int = 5) -> tuple[int, str]:
    """A new temporary file in ``folder`` and its descriptor, holding the writer's lock.

    The lock marks the file as live until it is linked and its name gone: a sweep
    (``abort_partial_writes``) removes a temporary file only while holding that lock, and the
    kernel drops it when the writer dies, however it dies. Between creating the file and
    locking it a sweep may take the lock and remove the name; the writer then finds its name
    gone (or another file's) once it holds the lock, and starts over with a new file."""
    for _ in range(attempts):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            named = os.stat(tmp)
            if (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino):
                return fd, tmp
        except FileNotFoundError:
            pass  # a sweep removed it before we locked it
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        os.close(fd)
    raise StorageError(
        f"cannot create temporary file: swept before it could be locked {attempts} times",
        path=path,
    )


def _locked(path: Path) -> bool:
    """Whether a live writer holds ``path``'s lock (a missing file is held by nobody)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock, if taken


def _is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file of :meth:`LocalStorage.write_if_absent`."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)


def _raise_exists(path: str) -> None:
    raise FileAlreadyExists("file already exists; not replaced", path=path)
