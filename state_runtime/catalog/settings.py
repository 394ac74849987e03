"""Where the catalog lives: one URL setting, ``STATE_CATALOG_URL``, with an embedded default."""

from __future__ import annotations

import os
from pathlib import Path

URL_ENV = "STATE_CATALOG_URL"
DEFAULT_DIR = "demo-output"
DEFAULT_FILE = "catalog.db"


def catalog_url(base_dir: str | os.PathLike[str] | None = None) -> str:
    """The catalog's SQLAlchemy URL.

    ``STATE_CATALOG_URL`` when set (for example
    ``postgresql+psycopg2://user@host:5432/state``); otherwise an embedded SQLite file,
    ``<base_dir>/catalog.db``, where ``base_dir`` defaults to ``./demo-output`` resolved
    against the current directory (the Makefile runs the demo, the CLI and Dagster from the
    repository root, so they all find the same file).
    """
    configured = os.environ.get(URL_ENV, "").strip()
    if configured:
        return configured
    directory = Path(base_dir) if base_dir is not None else Path.cwd() / DEFAULT_DIR
    return f"sqlite:///{(directory / DEFAULT_FILE).resolve()}"
