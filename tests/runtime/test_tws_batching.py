"""``transform_with_state`` tasks on real stores, without Spark (the comparison with Spark is
test_tws_vs_spark.py): a batch reads each value variable for all its keys in one lookup and
writes each variable in one call, and reads within a batch still see the batch's own writes
(value, list and map state, ``deleteIfExists`` between keys)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyspark.sql.types
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import StatefulOperator, transform_with_state
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.runtime.tws.operator import _make_row, _public_row, _row_builder
from state_runtime.storage import open_storage
from state_runtime.store.config import StoreConfig
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.state_store import StateStore

from .tws_processors import KeyCount


class Mixed(StatefulProcessor):
    """A count (value), the amounts (list) and the amounts by parity (map), each read back
    right after its write; the key ``"wipe"`` deletes every key's list."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n bigint")
        self.amounts = handle.getListState("amounts", "amount bigint")
        self.parity = handle.getMapState("parity", "odd boolean", "total bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        if key[0] == "wipe":
            self.handle.deleteIfExists("amounts")
        frame = pd.concat(list(rows))
        assert list(frame.index) == list(range(len(frame)))  # each key's frame from 0, as Spark
        amounts = [int(a) for a in frame["amount"]]
        (n,) = self.count.get() or (0,)
        self.count.update((n + len(amounts),))
        (counted,) = self.count.get() or (None,)
        self.amounts.appendList([(a,) for a in amounts])
        for a in amounts:
            (total,) = self.parity.getValue((a % 2 == 1,)) or (0,)
            self.parity.updateValue((a % 2 == 1,), (total + a,))
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "n": [counted],
                "listed": [",".join(str(a) for (a,) in self.amounts.get())],
                "odd": [dict(self.parity.iterator()).get((True,), (None,))[0]],
            }
        )


class Task:
    """One state partition of a ``transform_with_state`` operator, a committed version of
    each store per batch."""

    def __init__(
        self,
        tmp_path: Path,
        processor: StatefulProcessor,
        output: str,
        pandas: bool = True,
        key_type: str = "string",
        **options: Any,
    ) -> None:
        self.op: StatefulOperator = transform_with_state(
            0, ["k"], f"k {key_type}", processor, output, 1, pandas=pandas, **options
        )
        storage = open_storage(str(tmp_path))
        self.providers = {
            s.name: StateStoreProvider(
                storage,
                0,
                0,
                s.name,
                key_schema=s.schema.key,
                value_schema=s.schema.value,
                config=StoreConfig(),
            )
            for s in self.op.stores
        }
        self.ids: dict[str, str | None] = dict.fromkeys(self.providers)
        self.version = 0

    def batch(self, rows: list[tuple[Any, int]], time_ms: int = 1000) -> list[dict[str, Any]]:
        stores = {n: p.get_store(self.version, self.ids[n]) for n, p in self.providers.items()}
        with batch_scope(BatchContext("q", self.version, time_ms, 0, stores=stores)):
            table = pa.table({"k": [r[0] for r in rows], "amount": [r[1] for r in rows]})
            out = self.op.update(stores[self.op.store_name], table)
        for name, store in stores.items():
            self.ids[name] = store.commit().checkpoint_id
        self.version += 1
        assert isinstance(out, pa.Table)
        records: list[dict[str, Any]] = out.to_pylist()
        return records


def test_reads_within_a_batch_see_its_writes(tmp_path: Path) -> None:
    task = Task(tmp_path, Mixed(), "k string, n bigint, listed string, odd bigint")
    assert task.batch([("b", 2), ("a", 1), ("b", 3)]) == [
        {"k": "a", "n": 1, "listed": "1", "odd": 1},
        {"k": "b", "n": 2, "listed": "2,3", "odd": 3},
    ]
    # keys run in order: "wipe", last, deletes the lists "a", "b" and "c" built (and read)
    # before it, then starts its own; the next batch's lists start afresh
    assert task.batch([("c", 5), ("wipe", 4), ("a", 7), ("b", 4)]) == [
        {"k": "a", "n": 2, "listed": "1,7", "odd": 8},
        {"k": "b", "n": 3, "listed": "2,3,4", "odd": 3},
        {"k": "c", "n": 1, "listed": "5", "odd": 5},
        {"k": "wipe", "n": 1, "listed": "4", "odd": None},
    ]
    assert task.batch([("a", 2), ("b", 1)]) == [
        {"k": "a", "n": 3, "listed": "2", "odd": 8},
        {"k": "b", "n": 4, "listed": "1", "odd": 4},
    ]


class Shapes(StatefulProcessor):
    """Row form: each input row back in the shape its amount picks: a Row in the output's
    field order, a Row in another order, a tuple, a Row of a ``Row(*names)`` factory."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        for row in rows:
            assert row.asDict() == {"k": key[0], "amount": row.amount}
            k, n = row.k, row.amount
            yield [
                Row(k=k, amount=n, shape="row"),
                Row(shape="reordered", amount=n, k=k),
                (k, n, "tuple"),
                Row("k", "amount", "shape")(k, n, "factory"),
            ][n % 4]


@pytest.mark.parametrize(
    "amounts",
    [[0, 4], [2, 6], [1, 5], [3, 7], [0, 1, 2, 3]],
    ids=["rows", "tuples", "reordered", "factory", "mixed"],
)
def test_row_outputs_of_every_shape_become_the_output_table(
    tmp_path: Path, amounts: list[int]
) -> None:
    """Rows in the output's order and tuples go in by column, others by name (one path each
    batch): the table is the same either way."""
    task = Task(tmp_path, Shapes(), "k string, amount bigint, shape string", pandas=False)
    shapes = ["row", "reordered", "tuple", "factory"]
    rows = [(f"k{a}", a) for a in amounts]
    assert task.batch(rows) == [{"k": k, "amount": a, "shape": shapes[a % 4]} for k, a in rows]


def test_a_row_output_of_another_width_is_refused(tmp_path: Path) -> None:
    """A positional row (here a tuple) of another width than the output's is refused with a
    typed error naming the operator."""
    task = Task(tmp_path, Shapes(), "k string, amount bigint", pandas=False)
    with pytest.raises(InvalidArgument, match=r"transform_with_state \(operator 0\).* 3 values"):
        task.batch([("k2", 2)])


def test_the_row_builder_gives_the_rows_of_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Input Rows built by pyspark's private builder equal those of ``Row(*names)(*values)``
    (values and names); without that builder, the public form is used."""
    names, values = ["k", "amount", "at"], ("k1", 3, None)
    fast, public = _make_row(names, values), _public_row(names, values)
    assert fast == public and fast.asDict() == public.asDict() == dict(
        zip(names, values, strict=True)
    )
    monkeypatch.delattr(pyspark.sql.types, "_create_row")
    assert _row_builder() is _public_row


class RunningCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "count bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + sum(len(r) for r in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "count": [n]})


def test_a_batch_reads_and_writes_a_value_variable_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = Task(tmp_path, RunningCount(), "k string, count bigint")
    keys = [f"k{i}" for i in range(50)]
    task.batch([(k, 1) for k in keys])
    calls: Counter[tuple[str, str]] = Counter()
    for method in ("get", "get_many", "put", "apply", "remove"):
        original = getattr(StateStore, method)

        def spy(self: StateStore, *args: Any, _m: str = method, _f: Any = original) -> Any:
            calls[(self.store_id.store_name, _m)] += 1
            return _f(self, *args)

        monkeypatch.setattr(StateStore, method, spy)
    out = task.batch([(k, 1) for k in keys] + [("new", 1)])
    assert {r["k"]: r["count"] for r in out} == {**dict.fromkeys(keys, 2), "new": 1}
    assert {c: n for c, n in calls.items() if c[0] == "count"} == {
        ("count", "get_many"): 1,
        ("count", "apply"): 1,
    }


class KeyRepr(StatefulProcessor):
    """Outputs the ``repr`` of the key it is handed and the number of rows with it."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        if self.pandas:
            yield pd.DataFrame({"key": [repr(key)], "n": [sum(len(r) for r in rows)]})
        else:
            yield Row(key=repr(key), n=sum(1 for _ in rows))


T = datetime(2026, 1, 1, tzinfo=UTC)  # input tables hold UTC times


@pytest.mark.parametrize(
    ("key_type", "keys", "pandas", "handed"),
    [
        ("string", [None, "a", None], True, {"(nan,)": 2, "('a',)": 1}),
        ("bigint", [None, 1, None], True, {"(nan,)": 2, "(1.0,)": 1}),
        ("bigint", [2, 1], True, {"(1,)": 1, "(2,)": 1}),
        ("timestamp", [None, T], True, {"(NaT,)": 1, "(Timestamp('2026-01-01 00:00:00'),)": 1}),
        ("bigint", [None, 1, None], False, {"(None,)": 2, "(1,)": 1}),
    ],
    ids=["string", "bigint", "bigint-no-null", "timestamp", "bigint-Row"],
)
def test_keys_reach_the_processor_as_spark_hands_them(
    tmp_path: Path, key_type: str, keys: list[Any], pandas: bool, handed: dict[str, int]
) -> None:
    """The pandas form hands the key as Spark's worker takes it from its pandas frame: a null
    is the column's pandas null and an int column with a null is float (measured on Spark
    4.3 for string and bigint: ``(nan,)``, ``(1.0,)``; Spark splits a null bigint key's
    rows into one call per row, ours makes one call); the Row form hands ``None``."""
    task = Task(tmp_path, KeyRepr(pandas), "key string, n bigint", pandas, key_type)
    out = task.batch([(k, i) for i, k in enumerate(keys)])
    assert {r["key"]: r["n"] for r in out} == handed


def test_a_null_timestamp_key_is_handed_nat_and_keeps_its_state(tmp_path: Path) -> None:
    """The pandas form hands a null timestamp key as ``NaT`` and keeps its state from batch
    to batch, where Spark's worker fails setting that key (test_tws_null_keys.py; docs/
    transform-with-state.md, Equal to Spark)."""
    task = Task(tmp_path, KeyCount(), KeyCount.SCHEMA, key_type="timestamp")
    first = task.batch([(None, 0), (T, 1), (None, 2)])
    assert {r["key"]: r["n"] for r in first} == {
        "NaT": 2,
        "Timestamp('2026-01-01 00:00:00')": 1,
    }
    assert task.batch([(None, 3), (T, 4)]) == [
        {"key": "NaT", "n": 3},
        {"key": "Timestamp('2026-01-01 00:00:00')", "n": 2},
    ]
