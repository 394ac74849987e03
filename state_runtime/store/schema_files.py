"""Schema entries on storage: ``schemas/<schema id>.json`` below a checkpoint root.

A format 3 delta names its schema by id only. Wherever a store is opened with the catalog's
schema history (the driver ships it to the tasks with the operator; maintenance and readers
read it from the catalog) the id resolves in memory. A store opened without the catalog, with
a schema of its own, still has to read files written under other schemas (added nullable
fields read as null, widened fields are cast). So, before the first delta under a schema is
written, the writer puts the schema's history entry next to the state, once per root and
process (put-if-absent; content-addressed, so writers never disagree), and a loader that does
not know an id reads it from there. The file verifies itself: its id must be the fingerprint
of its content (:func:`state_runtime.store.schema_history.schema_id`).
"""

from __future__ import annotations

import contextlib
import json
import threading

from state_runtime.errors import FileAlreadyExists, StorageFileNotFound
from state_runtime.storage import Storage
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaEntry
from state_runtime.store.state_schema import StateSchema

SCHEMA_FOLDER = "schemas"
_known: dict[tuple[str, str], SchemaEntry | None] = {}
_lock = threading.Lock()


def schema_path(schema_id: str) -> str:
    return f"{SCHEMA_FOLDER}/{schema_id}.json"


def publish(storage: Storage, entry: SchemaEntry) -> None:
    """Make sure ``schemas/<id>.json`` of ``entry`` exists on ``storage`` (checked once per
    process and root)."""
    key = (storage.uri, entry.schema_id)
    with _lock:
        if _known.get(key) is not None:
            return
    data = json.dumps(
        {
            "schema_id": entry.schema_id,
            "key_schema": entry.schema.key.jsonValue(),
            "value_schema": entry.schema.value.jsonValue(),
            "parent_id": entry.parent_id,
            "change": entry.change.to_json(),
            "from_batch": entry.from_batch,
        },
        separators=(",", ":"),
    ).encode()
    path = schema_path(entry.schema_id)
    if not storage.exists(path):  # a HEAD, not a PUT that fails, in most new processes
        with contextlib.suppress(FileAlreadyExists):  # content-addressed: the same bytes
            storage.write_if_absent(path, data)
    with _lock:
        _known[key] = entry


def fetch(storage: Storage, schema_id: str) -> StateSchema | None:
    """The schema of entry ``schema_id`` as published on ``storage``, or None if it is not
    there or does not verify (the caller reports the id as unknown)."""
    key = (storage.uri, schema_id)
    with _lock:
        if key in _known:
            found = _known[key]
            return None if found is None else found.schema
    try:
        d = json.loads(storage.read(schema_path(schema_id)))
        entry = SchemaEntry.make(
            StateSchema.of(d["key_schema"], d["value_schema"]),
            d["parent_id"],
            SchemaChange.from_json(d["change"]),
            int(d["from_batch"]),
        )
    except StorageFileNotFound:
        return None  # not cached: it may be published later
    except (ValueError, KeyError, TypeError, RecursionError):
        entry = None
    if entry is not None and entry.schema_id != schema_id:
        entry = None
    with _lock:
        _known[key] = entry
    return None if entry is None else entry.schema
