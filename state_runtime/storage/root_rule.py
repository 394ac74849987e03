"""The one rule for checkpoint roots, shared by storage (opening a root) and the catalog
(recording one): a root the catalog accepts is a root storage can open.

Checked without opening anything (no client, no filesystem access), so the catalog applies
it when a root is first recorded and no fleet-wide maintenance meets a root it cannot open.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from urllib.parse import unquote, urlparse

from state_runtime.errors import InvalidArgument
from state_runtime.storage.base import check_relative_path

_BUCKET_RE: Final = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class RootLocation:
    """Where a root's files are: ``s3`` (``bucket`` and ``path``, the prefix) or ``local``
    (``path``, a filesystem path)."""

    scheme: Literal["s3", "local"]
    path: str
    bucket: str = ""


def check_bucket(bucket: str, prefix: str) -> str:
    """The prefix below an S3 bucket, stripped of slashes, if bucket and prefix are valid."""
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise InvalidArgument(f"invalid S3 bucket name {bucket!r}")
    prefix = prefix.strip("/")
    if prefix:
        check_relative_path(prefix)
    return prefix


def check_local_root(raw: str) -> str:
    """A local root path, if valid: non-empty, no ``..``."""
    if not raw:
        raise InvalidArgument("invalid checkpoint root '': empty")
    if ".." in Path(raw).parts:
        raise InvalidArgument(f"invalid checkpoint root {raw!r}: '..' is not allowed")
    return raw


def _decoded_path(raw: str, path: str) -> str:
    """The folder a ``file://`` URI's path names: percent-decoded, as ``Path.as_uri`` (how
    a local root is recorded) encodes it; else a root with a space, ``#`` or ``é`` would be
    maintained at a folder spelled with ``%20``."""
    try:
        decoded = unquote(path, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument(f"invalid checkpoint root {raw!r}: not UTF-8 once decoded") from None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in decoded):
        raise InvalidArgument(f"invalid checkpoint root {raw!r}: control characters")
    return decoded


def parse_root(root: str | os.PathLike[str]) -> RootLocation:
    """Where ``root`` (a local path, ``file://`` URI or ``s3://bucket/prefix``) keeps its files.

    Anything else is refused with InvalidArgument: other schemes, credentials in the URI
    (they belong in the environment), a ``file://`` URI naming another host, ``..``, control
    characters, an invalid bucket name.
    """
    raw = os.fspath(root)
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidArgument("invalid checkpoint root: empty")
    if len(raw) > 4096:
        raise InvalidArgument(f"invalid checkpoint root {raw[:64]!r}...: over 4096 characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        raise InvalidArgument(f"invalid checkpoint root {raw!r}: control characters")
    parsed = urlparse(raw)
    if parsed.scheme in {"s3", "s3a"}:
        if "@" in parsed.netloc:
            raise InvalidArgument("invalid S3 URI: must not contain credentials")
        if parsed.query or parsed.fragment or parsed.params or ":" in parsed.netloc:
            raise InvalidArgument(f"invalid S3 URI {raw!r}: no port, query or fragment allowed")
        return RootLocation("s3", check_bucket(parsed.netloc, parsed.path), parsed.netloc)
    if parsed.scheme == "file":
        if "@" in parsed.netloc:
            raise InvalidArgument("invalid checkpoint root: a file:// URI holds no credentials")
        if parsed.netloc not in {"", "localhost"} or parsed.query or parsed.fragment:
            raise InvalidArgument(
                f"invalid checkpoint root {raw!r}: use file:///absolute/path (no host, query "
                "or fragment)"
            )
        return RootLocation("local", check_local_root(_decoded_path(raw, parsed.path)))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise InvalidArgument(
            f"unsupported checkpoint root {raw!r}: use a path, file:///path or s3://bucket/prefix"
        )
    return RootLocation("local", check_local_root(raw))
