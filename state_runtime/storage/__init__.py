"""Pluggable storage for checkpoint files: local filesystem and S3."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from state_runtime.errors import InvalidArgument
from state_runtime.storage.base import (
    DeleteResult,
    FileInfo,
    PartialWrite,
    Storage,
    check_relative_path,
)
from state_runtime.storage.local import LocalStorage

__all__ = [
    "DeleteResult",
    "FileInfo",
    "LocalStorage",
    "PartialWrite",
    "Storage",
    "check_relative_path",
    "open_storage",
]


def open_storage(root: str | os.PathLike[str], **options: object) -> Storage:
    """Storage for a checkpoint root: a local path, ``file://`` URI or ``s3://bucket/prefix``.

    ``options`` go to the backend (for S3: ``endpoint_url``, ``region_name``, ...).
    """
    raw = os.fspath(root)
    parsed = urlparse(raw)
    if parsed.scheme in {"s3", "s3a"}:
        from state_runtime.storage.s3 import S3Storage

        return S3Storage.from_uri(raw, **options)  # type: ignore[arg-type]
    if parsed.scheme == "file":
        return LocalStorage(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise InvalidArgument(f"unsupported checkpoint root {raw!r}: use a path, file:// or s3://")
    return LocalStorage(raw)
