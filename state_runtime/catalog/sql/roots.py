"""How a SQLite catalog file stores checkpoint roots: relative to its own folder when it can.

A local root inside the folder of a SQLite catalog file (``demo-output/checkpoint`` beside
``demo-output/catalog.db``) is stored as ``./checkpoint``; so a folder holding a root and its
catalog can be moved or copied whole and opened where it lands. Every other root (any root
in PostgreSQL, S3 roots, local roots elsewhere) is stored as its URI. Readers always get the
URI back: the ``CheckpointRoot`` column type translates both ways, so callers never see the
stored form (the operators' SQL views on SQLite do).
"""

from __future__ import annotations

import functools
import weakref
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from sqlalchemy.engine import Dialect, Engine

from state_runtime.errors import InvalidArgument

RELATIVE = "./"
_FOLDERS: weakref.WeakKeyDictionary[Dialect, Path] = weakref.WeakKeyDictionary()


def anchor_roots(engine: Engine, database: Path) -> None:
    """Store the local roots below ``database``'s folder relative to it, for ``engine``."""
    _FOLDERS[engine.dialect] = database.expanduser().absolute().parent


def folder_of(dialect: Dialect) -> Path | None:
    """The folder relative roots of this engine are stored against (None: all absolute)."""
    return _FOLDERS.get(dialect)


@functools.lru_cache(maxsize=1024)
def stored_root(root: str, folder: Path | None) -> str:
    """``root`` (a URI) as the catalog stores it: ``./rel/path`` when it is a ``file:`` URI
    inside ``folder``, else unchanged. Worked out once per root: every statement naming a
    root binds it through here (parsing the URI and the path was some 0.1 ms a bind)."""
    if folder is None or not root.startswith("file:"):
        return root
    path = Path(unquote(urlsplit(root).path))
    try:
        relative = path.relative_to(folder)
    except ValueError:
        return root
    return RELATIVE + relative.as_posix() if relative.parts else "."


@functools.lru_cache(maxsize=1024)
def resolved_root(stored: str, folder: Path | None) -> str:
    """The URI of a root as stored (the inverse of :func:`stored_root`): resolved once per
    root, not per row (a fleet has a few roots per query, and pathlib interns each part it
    parses, so resolving every row of a fleet-wide pass churned the interpreter's table of
    interned strings: a resize of it is megabytes, which test_fleet_memory saw as growth)."""
    if folder is None or not (stored == "." or stored.startswith(RELATIVE)):
        return stored
    return (folder / PurePosixPath(stored)).as_uri()


def validate_root(root: str) -> str:
    """A checkpoint root as the catalog looks it up: a non-empty path or URI without control
    characters. Roots are compared as given, so callers pass one canonical spelling. A root
    is recorded only if storage could open it (``lookups.ensure_stores``), so this looser
    check serves lookups, and a root recorded by older code can still be reported on."""
    if not isinstance(root, str) or not root or len(root) > 4096:
        raise InvalidArgument(f"invalid checkpoint root {root!r}: expected 1-4096 characters")
    if any(ord(ch) < 32 for ch in root):
        raise InvalidArgument(f"invalid checkpoint root {root!r}: control characters")
    return root
