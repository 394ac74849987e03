"""What ``--json`` prints: any report of the library as plain JSON, every field included.

Dataclasses become objects of their fields (plus ``counts`` when the report has them), store
keys and checkpoint refs their printed names (``root#op/part/name``, ``version_id``), enums
their values, times ISO 8601 (UTC), durations seconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import Enum
from pathlib import PurePath
from typing import Any

import click

from state_runtime.catalog import StoreKey
from state_runtime.identity import CheckpointRef, StoreId


def jsonable(value: Any) -> Any:
    """``value`` as JSON-able lists, dicts, strings and numbers."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, StoreKey | StoreId | CheckpointRef | PurePath):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
        counts = getattr(value, "counts", None)
        return fields | ({"counts": jsonable(counts())} if callable(counts) else {})
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)  # an error kept in a report: its message


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout."""
    click.echo(json.dumps(jsonable(value), indent=2))
