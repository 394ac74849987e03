"""Pluggable storage for checkpoint files: local filesystem and S3."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from state_runtime.errors import InvalidArgument, MissingExtra
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

    ``options`` go to the backend (for S3: ``endpoint_url``, ``region_name``, ...). Anything
    else is refused with InvalidArgument: other schemes, credentials in the URI (they belong
    in the environment), a ``file://`` URI naming another host, ``..``, control characters.
    """
    raw = os.fspath(root)
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidArgument("invalid checkpoint root: empty")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        raise InvalidArgument(f"invalid checkpoint root {raw!r}: control characters")
    parsed = urlparse(raw)
    if parsed.scheme in {"s3", "s3a"}:
        try:
            from state_runtime.storage.s3 import S3Storage
        except ModuleNotFoundError as exc:  # boto3 comes with the s3 extra
            if (exc.name or "").split(".")[0] not in {"boto3", "botocore"}:
                raise
            raise MissingExtra(f"checkpoint root {raw!r}", "s3", exc.name) from None
        return S3Storage.from_uri(raw, **options)  # type: ignore[arg-type]
    if parsed.scheme == "file":
        if "@" in parsed.netloc:
            raise InvalidArgument("invalid checkpoint root: a file:// URI holds no credentials")
        if parsed.netloc not in {"", "localhost"} or parsed.query or parsed.fragment:
            raise InvalidArgument(
                f"invalid checkpoint root {raw!r}: use file:///absolute/path (no host, query "
                "or fragment)"
            )
        return LocalStorage(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise InvalidArgument(
            f"unsupported checkpoint root {raw!r}: use a path, file:///path or s3://bucket/prefix"
        )
    return LocalStorage(raw)
