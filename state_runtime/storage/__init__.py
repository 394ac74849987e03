"""Pluggable storage for checkpoint files: local filesystem and S3."""

from __future__ import annotations

import os

from state_runtime.errors import MissingExtra
from state_runtime.storage.base import (
    DeleteResult,
    FileInfo,
    PartialWrite,
    Storage,
    check_relative_path,
)
from state_runtime.storage.local import LocalStorage
from state_runtime.storage.root_rule import parse_root

__all__ = [
    "DeleteResult",
    "FileInfo",
    "LocalStorage",
    "PartialWrite",
    "Storage",
    "check_relative_path",
    "open_storage",
    "parse_root",
]


def open_storage(root: str | os.PathLike[str], **options: object) -> Storage:
    """Storage for a checkpoint root: a local path, ``file://`` URI or ``s3://bucket/prefix``.

    ``options`` go to the backend (for S3: ``endpoint_url``, ``region_name``, ...). A root
    :func:`~state_runtime.storage.root_rule.parse_root` refuses is refused with InvalidArgument.
    """
    location = parse_root(root)
    if location.scheme == "local":
        return LocalStorage(location.path)
    try:
        from state_runtime.storage.s3 import S3Storage
    except ModuleNotFoundError as exc:  # boto3 comes with the s3 extra
        if (exc.name or "").split(".")[0] not in {"boto3", "botocore"}:
            raise
        raise MissingExtra(f"checkpoint root {os.fspath(root)!r}", "s3", exc.name) from None
    return S3Storage.from_uri(os.fspath(root), **options)  # type: ignore[arg-type]
