"""Crafted checkpoint files: a correct envelope and checksum around a payload that is not a
valid checkpoint. Each must raise CheckpointFileCorrupt naming the file, never another error."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest

from state_runtime.errors import CheckpointFileCorrupt
from state_runtime.storage import Storage
from state_runtime.store.checkpoint_format import (
    HEADER_KEY,
    FileHeader,
    decode,
)

from .store_helpers import arrow_stream, commit_rows, envelope, provider_for


def _ipc(table: pa.Table, header: bytes | None) -> bytes:
    return arrow_stream(table, None if header is None else {HEADER_KEY: header})


Craft = Callable[[FileHeader, pa.Table], bytes]


def _with_columns(**columns: pa.Array) -> Craft:
    return lambda header, _: _ipc(pa.table(columns), header.to_json())


def _header_json(edit: Callable[[dict[str, object]], object]) -> Craft:
    def craft(header: FileHeader, table: pa.Table) -> bytes:
        d = json.loads(header.to_json())
        return _ipc(table, json.dumps(edit(d)).encode())

    return craft


def _without(field: str) -> Callable[[dict[str, object]], object]:
    return lambda d: {k: v for k, v in d.items() if k != field}


KEY = pa.struct([("user", pa.string())])
VALUE = pa.struct([("count", pa.int64())])
KEYS = pa.array([{"user": "a"}], type=KEY)
VALUES = pa.array([{"count": 1}], type=VALUE)

CRAFTED: dict[str, Craft] = {
    "garbage arrow bytes": lambda h, t: b"\x00\x01 not an arrow stream \xff" * 8,
    "an arrow file, not a stream": lambda h, t: b"ARROW1\x00\x00" + b"\x00" * 64,
    "no header": lambda h, t: _ipc(t.replace_schema_metadata(None), None),
    "header not json": lambda h, t: _ipc(t, b"{not json"),
    "header a json list": _header_json(lambda d: [1, 2, 3]),
    "header without lineage": _header_json(_without("lineage")),
    "header with a bad key schema": _header_json(lambda d: {**d, "key_schema": {"x": 1}}),
    "header with a non-numeric version": _header_json(lambda d: {**d, "version": "one"}),
    "missing key column": _with_columns(k=KEYS, value=VALUES),
    "non-struct key": _with_columns(key=pa.array(["a"]), value=VALUES),
    "wrong key field type": _with_columns(
        key=pa.array([{"user": 1}], type=pa.struct([("user", pa.int64())])), value=VALUES
    ),
    "wrong value type": _with_columns(
        key=KEYS, value=pa.array([{"count": "x"}], type=pa.struct([("count", pa.string())]))
    ),
    "non-struct value": _with_columns(key=KEYS, value=pa.array([1])),
    "extra column": _with_columns(key=KEYS, value=VALUES, extra=pa.array([1])),
    "columns swapped": _with_columns(value=VALUES, key=KEYS),
    "null key": _with_columns(key=pa.array([None], type=KEY), value=VALUES),
    "duplicate keys": lambda h, t: _header_json(lambda d: {**d, "file_rows": 2})(
        h,
        pa.table(
            {
                "key": pa.array([{"user": "a"}, {"user": "a"}], type=KEY),
                "value": pa.array([{"count": 1}, {"count": 2}], type=VALUE),
            }
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_payload_with_a_right_checksum_is_corrupt(storage: Storage, case: str) -> None:
    provider = provider_for(storage)
    v1 = commit_rows(provider, None, {"a": 1})
    header, table = decode(storage.read(v1.path), v1.path, schemas=provider.history.schema_of)
    payload = CRAFTED[case](header, table)
    storage.delete([v1.path])
    storage.write_if_absent(v1.path, envelope(payload))
    with pytest.raises(CheckpointFileCorrupt) as err:
        provider_for(storage).get_read_store(1, v1.checkpoint_id)
    assert err.value.path == v1.path and v1.path in str(err.value)
    if case != "duplicate keys":  # maintenance parses files with the same function
        with pytest.raises(CheckpointFileCorrupt):
            decode(storage.read(v1.path), v1.path)
