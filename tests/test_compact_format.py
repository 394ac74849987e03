"""Format 3 deltas: round trip over schemas and rows, every corruption a typed error naming the
file, schema ids resolved (history, schemas/ folder) or refused, older formats still load."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime import StateStoreProvider
from state_runtime.errors import CheckpointFileCorrupt, SchemaMismatch
from state_runtime.identity import CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.storage import LocalStorage, Storage
from state_runtime.store import compact_format
from state_runtime.store.checkpoint_format import (
    HEADER_KEY,
    FileHeader,
    checksum,
    decode,
    encode,
    now,
    read_header,
)
from state_runtime.store.file_verification import Expected, verify_bytes
from state_runtime.store.schema_files import schema_path
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema

from .store_helpers import arrow_stream, commit_rows, envelope, provider_for, state_of

STORE = StoreId(0, 3)
SCHEMA = StateSchema.of("k bigint", "v bigint")
HISTORY = SchemaHistory.of(SCHEMA)


def _header(
    schema: StateSchema,
    rows: int,
    *,
    version: int = 2,
    schema_id: str | None = None,
    kind: FileKind = FileKind.DELTA,
) -> FileHeader:
    lineage = (CheckpointRef(version - 1, new_checkpoint_id()),) if version > 1 else ()
    return FileHeader(
        kind,
        STORE,
        version,
        new_checkpoint_id(),
        lineage,
        schema,
        rows,
        rows + 5,
        now(),
        schema_id or SchemaHistory.of(schema).newest.schema_id,
    )


def _delta(keys: list[int], values: list[int | None], **kw: Any) -> tuple[FileHeader, bytes]:
    header = _header(SCHEMA, len(keys), **kw)
    k = pa.array([{"k": x} for x in keys], type=SCHEMA.key_arrow)
    v = pa.array([None if x is None else {"v": x} for x in values], type=SCHEMA.value_arrow)
    return header, encode(header, k, v)


# --- sizes ---------------------------------------------------------------------------------


def test_ten_bigint_rows_take_under_a_tenth_of_format_2() -> None:
    keys = [3, 917, 4_021, 10_200, 22_222, 40_001, 51_515, 70_000, 88_888, 99_999]
    header, data = _delta(keys, [2, 3, 1, 4, 2, 2, 3, 1, 4, 2], version=25)
    assert data[8:10] == b"\x03\x00"  # format 3
    old = encode(
        FileHeader(**{**header.__dict__, "schema_id": None}),  # pre-id deltas stay format 2
        pa.array([{"k": x} for x in keys], type=SCHEMA.key_arrow),
        pa.array([{"v": 1}] * 10, type=SCHEMA.value_arrow),
    )
    assert old[8:10] == b"\x02\x00"
    assert len(data) * 8 < len(old)
    # Fixed overhead: the file minus its row bytes (keys as int16 steps, values as int8).
    assert len(data) - (10 * 2 + 10 * 1) <= 100


def test_an_empty_delta_is_its_fixed_overhead() -> None:
    _, data = _delta([], [], version=7)
    assert len(data) <= 100
    header, table = decode(data, "x.delta", schemas=HISTORY.schema_of)
    assert table.num_rows == 0 and header.version == 7


# --- round trip ----------------------------------------------------------------------------

_FIELD_TYPES: dict[str, st.SearchStrategy[Any]] = {
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "int": st.integers(-(2**31), 2**31 - 1),
    "smallint": st.integers(-(2**15), 2**15 - 1),
    "string": st.text(max_size=8),
    "double": st.floats(allow_nan=False),
    "boolean": st.booleans(),
    "binary": st.binary(max_size=8),
    "decimal(10,2)": st.decimals(
        min_value=-(10**7), max_value=10**7, places=2, allow_nan=False, allow_infinity=False
    ),
    "timestamp": st.datetimes(
        min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2100, 1, 1)
    ).map(lambda t: t.replace(tzinfo=dt.UTC)),
    "array<int>": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
    "map<string,bigint>": st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=3).map(
        lambda d: list(d.items())
    ),
    "struct<a:int,b:string>": st.fixed_dictionaries(
        {"a": st.integers(-5, 5), "b": st.text(max_size=3)}
    ),
}


@st.composite
def _deltas(draw: st.DrawFn) -> tuple[StateSchema, list[tuple[Any, ...]], list[Any]]:
    key_types = draw(st.lists(st.sampled_from(["bigint", "int", "string"]), min_size=1, max_size=2))
    value_types = draw(st.lists(st.sampled_from(sorted(_FIELD_TYPES)), min_size=1, max_size=3))
    schema = StateSchema.of(
        ", ".join(f"k{i} {t}" for i, t in enumerate(key_types)),
        ", ".join(f"v{i} {t}" for i, t in enumerate(value_types)),
    )
    keys = draw(
        st.lists(st.tuples(*(_FIELD_TYPES[t] for t in key_types)), max_size=30, unique=True)
    )
    values = draw(
        st.lists(
            st.one_of(
                st.none(),
                st.tuples(*(st.one_of(st.none(), _FIELD_TYPES[t]) for t in value_types)),
            ),
            min_size=len(keys),
            max_size=len(keys),
        )
    )
    return schema, keys, values


def _struct(schema_type: pa.StructType, rows: list[Any]) -> pa.StructArray:
    names = [f.name for f in schema_type]
    as_dicts = [None if r is None else dict(zip(names, r, strict=True)) for r in rows]
    return pa.array(as_dicts, type=schema_type)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_deltas(), st.sampled_from(["zstd", "lz4", "none"]))
def test_round_trip_over_schemas_and_rows(
    drawn: tuple[StateSchema, list[tuple[Any, ...]], list[Any]], compression: str
) -> None:
    schema, keys, values = drawn
    header = _header(schema, len(keys))
    k, v = _struct(schema.key_arrow, keys), _struct(schema.value_arrow, values)
    data = encode(header, k, v, compression)  # type: ignore[arg-type]
    assert data[8:10] == b"\x03\x00"
    lookup = {header.schema_id: schema}.get
    found, table = decode(data, "f.delta", schemas=lookup)  # type: ignore[arg-type]
    assert (found.version, found.checkpoint_id, found.lineage) == (
        header.version,
        header.checkpoint_id,
        header.lineage,
    )
    assert (found.file_rows, found.state_rows, found.schema_id) == (
        header.file_rows,
        header.state_rows,
        header.schema_id,
    )
    assert found.created_at == header.created_at and found.depth == 1
    got = {
        _freeze(key): value
        for key, value in zip(
            table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
        )
    }
    names_k = [f.name for f in schema.key_arrow]
    names_v = [f.name for f in schema.value_arrow]
    want = {
        _freeze(dict(zip(names_k, kr, strict=True))): _normalise(
            None if vr is None else dict(zip(names_v, vr, strict=True))
        )
        for kr, vr in zip(keys, values, strict=True)
    }
    assert got == want
    assert read_header(data, "f.delta").schema is None  # the header alone names the id


def _freeze(d: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(d.items()))


def _normalise(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A drawn value as pyarrow reads it back (decimals at the schema's scale)."""
    if value is None:
        return None
    out = {}
    for name, x in value.items():
        if isinstance(x, decimal.Decimal):
            x = x.quantize(decimal.Decimal("0.01"))
        out[name] = x
    return out


# --- corruption ----------------------------------------------------------------------------


def _small_file() -> tuple[FileHeader, bytes]:
    return _delta([5, 9, 12], [1, None, 3], version=4)


def test_truncation_at_every_offset_is_corrupt() -> None:
    _, data = _small_file()
    for cut in range(len(data)):
        with pytest.raises(CheckpointFileCorrupt) as err:
            decode(data[:cut], "s/4_x.delta", schemas=HISTORY.schema_of)
        assert err.value.path == "s/4_x.delta"


def test_a_flipped_byte_anywhere_is_corrupt() -> None:
    _, data = _small_file()
    for at in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[at] ^= bit
            with pytest.raises(CheckpointFileCorrupt):
                decode(bytes(bad), "f.delta", schemas=HISTORY.schema_of)


def test_an_appended_byte_is_corrupt() -> None:
    _, data = _small_file()
    with pytest.raises(CheckpointFileCorrupt, match="truncated or extended"):
        decode(data + b"\x00", "f.delta", schemas=HISTORY.schema_of)


def _recrc(body: bytes) -> bytes:
    """A format 3 file from its bytes after the CRC, with a right CRC (crafted content)."""
    return compact_format.PREFIX.pack(b"STRTCKPT", 3, zlib.crc32(body)) + body


def test_crafted_bytes_with_a_right_crc_are_corrupt_never_a_crash() -> None:
    _, data = _small_file()
    rest = data[compact_format.PREFIX.size :]
    for at in range(1, len(rest)):
        for value in (0x00, 0x7F, 0xFF):
            bad = bytearray(rest)
            bad[at] = value
            # typed, naming the file; anything else fails the test
            with contextlib.suppress(CheckpointFileCorrupt, SchemaMismatch):
                decode(_recrc(bytes(bad)), "f.delta", schemas=HISTORY.schema_of)


def test_a_wrong_schema_id_is_corrupt() -> None:
    """A file naming a known schema it was not written with does not parse under it."""
    other = StateSchema.of("k string", "v string")
    header, data = _delta([1, 2], [3, 4], version=2)
    lookup = {header.schema_id: other}.get
    with pytest.raises(CheckpointFileCorrupt, match=f"schema {header.schema_id}"):
        decode(data, "f.delta", schemas=lookup)  # type: ignore[arg-type]


def test_an_unknown_schema_id_is_a_schema_mismatch_naming_the_file(tmp_path: Path) -> None:
    written = LocalStorage(tmp_path / "written")
    provider = provider_for(written)
    v1 = commit_rows(provider, None, {"a": 1})
    assert written.exists(schema_path(provider.history.newest.schema_id))
    with pytest.raises(SchemaMismatch):
        decode(written.read(v1.path), v1.path)  # no lookup at all
    storage = LocalStorage(tmp_path / "copied")  # the delta without the root's schemas/
    storage.write_if_absent(v1.path, written.read(v1.path))
    stranger = StateStoreProvider(storage, 0, 0, key_schema="user string", value_schema="n int")
    with pytest.raises(SchemaMismatch, match="neither this store's schema history") as err:
        stranger.get_read_store(1, v1.checkpoint_id)
    assert err.value.path == v1.path and err.value.version == 1


def test_the_schemas_folder_serves_stores_opened_without_the_catalog(storage: Storage) -> None:
    """A provider of a wider schema reads deltas written under the narrower one: the id
    resolves through schemas/<id>.json, which verifies itself."""
    v1 = commit_rows(provider_for(storage), None, {"a": 1})
    wider = StateStoreProvider(
        storage, 0, 0, key_schema="user string", value_schema="count bigint, note string"
    )
    assert dict(wider.get_read_store(1, v1.checkpoint_id).items()) == {("a",): (1, None)}


def test_a_corrupt_file_in_a_store_fails_its_load_naming_store_and_version(
    storage: Storage,
) -> None:
    provider = provider_for(storage)
    v1 = commit_rows(provider, None, {"a": 1, "b": 2})
    v2 = commit_rows(provider, v1, {"c": 3})
    data = storage.read(v2.path)
    storage.delete([v2.path])
    storage.write_if_absent(v2.path, data[:-3])
    with pytest.raises(CheckpointFileCorrupt) as err:
        provider_for(storage).get_read_store(2, v2.checkpoint_id)
    assert (err.value.path, err.value.version, str(err.value.store)) == (v2.path, 2, "0/0/default")


def test_the_catalog_checksum_covers_the_whole_file() -> None:
    _, data = _small_file()
    bad = bytearray(data)
    bad[-1] ^= 1
    assert checksum(data) != checksum(bytes(bad)) and len(checksum(data)) == 64


# --- older formats -------------------------------------------------------------------------


def _format2_delta(header: FileHeader, keys: list[str], values: list[int]) -> bytes:
    table = pa.table(
        {
            "key": pa.array([{"user": k} for k in keys], type=pa.struct([("user", pa.string())])),
            "value": pa.array(
                [{"count": v} for v in values], type=pa.struct([("count", pa.int64())])
            ),
        }
    )
    return envelope(arrow_stream(table, {HEADER_KEY: header.to_json()}, "zstd"))


def test_a_store_of_format_2_deltas_loads_and_goes_on_in_format_3(storage: Storage) -> None:
    schema = StateSchema.of("user string", "count bigint")
    store = StoreId(0, 0)
    refs: list[CheckpointRef] = []
    for version in (1, 2, 3):
        ref = CheckpointRef(version, new_checkpoint_id())
        header = FileHeader(
            FileKind.DELTA,
            store,
            version,
            ref.checkpoint_id or "",
            tuple(reversed(refs)),
            schema,
            1,
            version,
            now(),
            SchemaHistory.of(schema).newest.schema_id,
        )
        data = _format2_delta(header, [f"k{version}"], [version])
        storage.write_if_absent(
            store.file_path(version, ref.checkpoint_id or "", FileKind.DELTA), data
        )
        refs.append(ref)
    writer = provider_for(storage)
    base = writer.get_store(3, refs[-1].checkpoint_id)
    base.put(("k4",), (4,))
    v4 = base.commit()
    assert storage.read(v4.path)[8:10] == b"\x03\x00"
    assert v4.lineage == (refs[2], refs[1], refs[0])
    cold = provider_for(storage)
    assert state_of(cold, v4) == {"k1": 1, "k2": 2, "k3": 3, "k4": 4}
    v5 = commit_rows(cold, v4, {"k5": 5})
    assert v5.lineage[:4] == (v4.ref, refs[2], refs[1], refs[0])


def test_a_cached_copy_rolls_forward_through_format_3_deltas(storage: Storage) -> None:
    """A format 3 delta names only its parent: a worker a few versions behind walks parent by
    parent to its cached copy and applies only what it missed."""
    writer = provider_for(storage)
    infos = [commit_rows(writer, None, {"a": 1})]
    for i in range(4):
        infos.append(commit_rows(writer, infos[-1], {f"k{i}": i}))
    behind = provider_for(storage)
    behind.get_read_store(2, infos[1].checkpoint_id)  # cached at version 2
    store = behind.get_read_store(5, infos[4].checkpoint_id)
    assert store.metrics.load.source.value == "roll_forward"
    assert store.metrics.load.deltas_applied == 3
    assert dict(store.items()) == {
        ("a",): (1,),
        ("k0",): (0,),
        ("k1",): (1,),
        ("k2",): (2,),
        ("k3",): (3,),
    }
    child = commit_rows(behind, infos[4], {"z": 9})
    assert child.lineage == tuple(i.ref for i in reversed(infos))[: len(child.lineage)]
    assert len(child.lineage) == 5


def test_rows_are_parsed_again_only_when_asked() -> None:
    """A delta whose recorded checksum covers its bytes is verified by its header (the rows
    parsed when recorded); ``rows=True`` (reconcile, before it records a file) parses them:
    rows crafted with a right CRC and a matching checksum are found only then."""
    header, data = _small_file()
    rest = bytearray(data[compact_format.PREFIX.size :])
    rest[-4] ^= 0x55  # in the rows' buffers
    bad = _recrc(bytes(rest))
    path = header.store.file_path(header.version, header.checkpoint_id, FileKind.DELTA)
    base = header.lineage[0].checkpoint_id if header.lineage else None
    ref = CheckpointRef(header.version, header.checkpoint_id)
    expected = Expected(header.store, ref, FileKind.DELTA, path, len(bad), checksum(bad), base)
    assert verify_bytes(bad, expected, HISTORY.schema_of) is None
    found = verify_bytes(bad, expected, HISTORY.schema_of, rows=True)
    assert found is not None and "rows do not parse" in found
    intact = replace(expected, size=len(data), checksum=checksum(data))
    assert verify_bytes(data, intact, HISTORY.schema_of, rows=True) is None
