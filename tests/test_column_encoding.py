"""Format version 2: integer fields stored narrow. Every file reads back exactly; version 1
files still load; a crafted encoding is a corrupt file naming it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_runtime import StateStoreProvider
from state_runtime.errors import CheckpointFileCorrupt
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.storage import LocalStorage
from state_runtime.store import column_encoding
from state_runtime.store.checkpoint_format import (
    _ENVELOPE,
    HEADER_KEY,
    FileHeader,
    decode,
    encode,
    now,
)
from state_runtime.store.column_encoding import ENCODINGS_KEY
from state_runtime.store.state_schema import StateSchema

from .store_helpers import arrow_stream, envelope

INT64 = (-(1 << 63), (1 << 63) - 1)
WIDTHS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
STORE = StoreId(0, 0, "default")


def _header(schema: StateSchema, rows: int) -> FileHeader:
    return FileHeader(FileKind.DELTA, STORE, 1, "a" * 32, (), schema, rows, rows, now())


def _ints(spark_type: str) -> st.SearchStrategy[int]:
    bits = WIDTHS[spark_type] - 1
    return st.integers(-(1 << bits), (1 << bits) - 1)


@st.composite
def _tables(draw: st.DrawFn) -> tuple[StateSchema, pa.Table]:
    key_types = draw(st.lists(st.sampled_from(list(WIDTHS)), min_size=1, max_size=2))
    value_types = draw(st.lists(st.sampled_from(list(WIDTHS)), min_size=1, max_size=3))
    schema = StateSchema.of(
        ", ".join(f"k{i} {t}" for i, t in enumerate(key_types)),
        ", ".join(f"v{i} {t}" for i, t in enumerate(value_types)),
    )
    keys = draw(
        st.lists(
            st.tuples(*[_ints(t) for t in key_types]),
            min_size=0,
            max_size=60,
            unique=True,
        )
    )
    values = [
        None  # a removed key
        if draw(st.integers(0, 9)) == 0
        else {
            f"v{i}": None if draw(st.integers(0, 5)) == 0 else draw(_ints(t))
            for i, t in enumerate(value_types)
        }
        for _ in keys
    ]
    table = pa.table(
        {
            "key": pa.array(
                [{f"k{i}": x for i, x in enumerate(k)} for k in keys], type=schema.key_arrow
            ),
            "value": pa.array(values, type=schema.value_arrow),
        }
    )
    return schema, table


@pytest.fixture(params=["python", "arrow"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A field is decoded in Python when short (a tiny file's few values), else by Arrow
    compute: each test below runs through both, for the same values and the same errors."""
    small = column_encoding.SMALL if request.param == "python" else -1
    monkeypatch.setattr(column_encoding, "SMALL", small)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(_tables())
@pytest.mark.usefixtures("decode_path")
def test_every_file_reads_back_exactly(case: tuple[StateSchema, pa.Table]) -> None:
    schema, table = case
    data = encode(_header(schema, table.num_rows), table.column("key"), table.column("value"))
    _, decoded = decode(data, "f.delta")
    assert decoded.schema.remove_metadata() == table.schema

    def rows(t: pa.Table) -> list[tuple[tuple[int, ...], object]]:
        pairs = zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
        return sorted(((tuple(k.values()), v) for k, v in pairs), key=lambda r: r[0])

    assert rows(decoded) == rows(table)


def test_repeated_field_names_read_back() -> None:
    """Spark structs may repeat a field name: encodings go by position."""
    schema = StateSchema.of("k bigint, k int", "n bigint, n bigint")
    table = pa.table(
        {
            "key": pa.StructArray.from_arrays(
                [pa.array([1, 2, 3], pa.int64()), pa.array([7, 8, 9], pa.int32())],
                fields=list(schema.key_arrow),
            ),
            "value": pa.StructArray.from_arrays(
                [pa.array([5, 6, 7], pa.int64()), pa.array([100, 200, None], pa.int64())],
                fields=list(schema.value_arrow),
            ),
        }
    )
    _, decoded = decode(encode(_header(schema, 3), table.column("key"), table.column("value")), "f")
    assert decoded.column("key").combine_chunks().flatten()[1].to_pylist() == [7, 8, 9]
    assert decoded.column("value").combine_chunks().flatten()[1].to_pylist() == [100, 200, None]


@pytest.mark.usefixtures("decode_path")
def test_extremes_and_one_row_read_back() -> None:
    schema = StateSchema.of("k bigint", "v bigint, w int")
    for keys in ([INT64[0], INT64[1]], [INT64[1]], [0, 1, INT64[1]], [INT64[0], -1, 0]):
        values = [{"v": k, "w": 7} for k in keys]
        table = pa.table(
            {
                "key": pa.array([{"k": k} for k in keys], type=schema.key_arrow),
                "value": pa.array(values, type=schema.value_arrow),
            }
        )
        _, decoded = decode(
            encode(_header(schema, len(keys)), table.column("key"), table.column("value")), "f"
        )
        assert decoded.column("key").to_pylist() == [{"k": k} for k in keys]
        assert decoded.column("value").to_pylist() == values


def _delta_like_the_benchmark(encoded: bool) -> int:
    """A delta of 2,500 random keys out of 1M with small running counts."""
    rng = random.Random(7)
    keys = sorted(rng.sample(range(1_000_000), 2_500))
    schema = StateSchema.of("k bigint", "count bigint")
    table = pa.table(
        {
            "key": pa.array([{"k": k} for k in keys], type=schema.key_arrow),
            "value": pa.array([{"count": rng.randint(1, 4)} for _ in keys], schema.value_arrow),
        }
    )
    data = encode(_header(schema, len(keys)), table.column("key"), table.column("value"))
    if encoded:
        return len(data)
    _, decoded = decode(data, "f")
    header = {HEADER_KEY: _header(schema, len(keys)).to_json()}
    return len(envelope(arrow_stream(decoded, header, compression="zstd")))


def test_narrow_integers_make_deltas_smaller() -> None:
    assert _delta_like_the_benchmark(True) < 0.8 * _delta_like_the_benchmark(False)


def _file(fmt: int, table: pa.Table, header: bytes, encodings: object = None) -> bytes:
    metadata = {HEADER_KEY: header}
    if encodings is not None:
        raw = encodings if isinstance(encodings, bytes) else json.dumps(encodings).encode()
        metadata[ENCODINGS_KEY] = raw
    return envelope(arrow_stream(table, metadata), fmt)


SCHEMA = StateSchema.of("k bigint", "count bigint")


def _plain(keys: list[int], counts: list[int | None]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([{"k": k} for k in keys], type=SCHEMA.key_arrow),
            "value": pa.array([{"count": c} for c in counts], type=SCHEMA.value_arrow),
        }
    )


def _provider(root: Path) -> StateStoreProvider:
    return StateStoreProvider(
        LocalStorage(root), 0, 0, key_schema="k bigint", value_schema="count bigint"
    )


def test_version_1_files_still_load(tmp_path: Path) -> None:
    """A store written before format 2 (every field as its schema says) loads and continues."""
    header = json.loads(_header(SCHEMA, 3).to_json())
    header["format_version"] = 1
    data = _file(1, _plain([1, 5, 9], [10, 50, 90]), json.dumps(header).encode())
    storage = LocalStorage(tmp_path)
    storage.write_if_absent(STORE.file_path(1, "a" * 32, FileKind.DELTA), data)
    store = _provider(tmp_path).get_store(1, "a" * 32)
    assert dict(store.items()) == {(1,): (10,), (5,): (50,), (9,): (90,)}
    store.put((5,), (51,))
    info = store.commit()
    raw = storage.read(info.path)
    assert _ENVELOPE.unpack_from(raw)[1] == 3  # new deltas are format 3
    fresh = _provider(tmp_path).get_read_store(info.version, info.checkpoint_id)
    assert dict(fresh.items()) == {(1,): (10,), (5,): (51,), (9,): (90,)}


NARROW_KEYS = pa.array([{"k": k} for k in (0, 3, 2)], type=pa.struct([("k", pa.int8())]))
NARROW_COUNTS = pa.array([{"count": c} for c in (0, 1, 2)], type=pa.struct([("count", pa.int8())]))
CRAFTED: dict[str, tuple[pa.Table, object]] = {
    "unknown kind": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {"key.0": {"kind": "zigzag", "base": 0}},
    ),
    "base not an integer": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {"key.0": {"kind": "delta", "base": "1"}, "value.0": {"kind": "offset", "base": 1}},
    ),
    "base beyond 64 bits": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {
            "key.0": {"kind": "offset", "base": 1 << 70},
            "value.0": {"kind": "offset", "base": 0},
        },
    ),
    "delta that does not start at 0": (
        pa.table(
            {
                "key": pa.array([{"k": k} for k in (1, 3, 2)], NARROW_KEYS.type),
                "value": NARROW_COUNTS,
            }
        ),
        {"key.0": {"kind": "delta", "base": 0}, "value.0": {"kind": "offset", "base": 0}},
    ),
    "delta on a value field": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {"key.0": {"kind": "offset", "base": 0}, "value.0": {"kind": "delta", "base": 0}},
    ),
    "values overflowing 64 bits": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {
            "key.0": {"kind": "offset", "base": INT64[1] - 1},
            "value.0": {"kind": "offset", "base": 0},
        },
    ),
    "a field the schema does not have": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {
            "key.0": {"kind": "offset", "base": 0},
            "value.0": {"kind": "offset", "base": 0},
            "value.1": {"kind": "offset", "base": 0},
        },
    ),
    "negative delta steps": (
        pa.table(
            {
                "key": pa.array([{"k": k} for k in (0, 3, -2)], NARROW_KEYS.type),
                "value": NARROW_COUNTS,
            }
        ),
        {"key.0": {"kind": "delta", "base": 0}, "value.0": {"kind": "offset", "base": 0}},
    ),
    "deeply nested encodings": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        b"[" * 100_000 + b"]" * 100_000,
    ),
    "encodings not an object": (pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}), [1]),
    "a narrow field without its encoding": (
        pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS}),
        {"key.0": {"kind": "offset", "base": 0}},
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
@pytest.mark.usefixtures("decode_path")
def test_crafted_encodings_are_corrupt_files(tmp_path: Path, case: str) -> None:
    table, encodings = CRAFTED[case]
    path = STORE.file_path(1, "a" * 32, FileKind.DELTA)
    LocalStorage(tmp_path).write_if_absent(
        path, _file(2, table, _header(SCHEMA, 3).to_json(), encodings)
    )
    with pytest.raises(CheckpointFileCorrupt) as err:
        _provider(tmp_path).get_read_store(1, "a" * 32)
    assert err.value.path == path and path in str(err.value)


def test_encodings_in_a_version_1_file_are_corrupt(tmp_path: Path) -> None:
    header = json.loads(_header(SCHEMA, 3).to_json())
    header["format_version"] = 1
    table = pa.table({"key": NARROW_KEYS, "value": NARROW_COUNTS})
    encodings = {
        "key.0": {"kind": "offset", "base": 0},
        "value.0": {"kind": "offset", "base": 0},
    }
    data = _file(1, table, json.dumps(header).encode(), encodings)
    with pytest.raises(CheckpointFileCorrupt, match="encodings in a format version 1 file"):
        decode(data, "f.delta", STORE, CheckpointRef(1, "a" * 32))
