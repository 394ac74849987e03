"""An update's iterable output may mix Arrow tables, record batches and tuples: each comes
out as batches of the operator's output schema, in order (a record batch once failed with a
TypeError from ``zip``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from state_runtime.runtime.tasks import _output_batches

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])


def test_tables_record_batches_and_tuples_come_out_in_order() -> None:
    def output() -> Iterator[Any]:
        yield ("a", 1)
        yield pa.record_batch({"k": ["b"], "n": pa.array([2], pa.int32())})
        yield pa.table({"k": ["c"], "n": [3]})
        yield ("d", 4)

    batches = list(_output_batches(output(), SCHEMA))
    assert all(b.schema == SCHEMA for b in batches)
    assert pa.Table.from_batches(batches).to_pylist() == [
        {"k": k, "n": n} for k, n in [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    ]
