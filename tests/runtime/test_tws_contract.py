"""``transform_with_state``'s contract beyond the outputs compared with Spark
(test_tws_vs_spark.py): the change feed of one variable, output modes, the refusals Spark
makes too, ``close()`` per partition and batch, and what a map read costs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from state_runtime.errors import InvalidArgument
from state_runtime.runtime import read_state_changes, transform_with_state
from state_runtime.store.state_store import StateStore

from .test_tws_batching import RunningCount, Task
from .tws_processors import HOUR_MS, session_tracker_batches


@pytest.mark.spark
def test_the_change_feed_reads_one_variable_or_the_timers(
    spark: SparkSession, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    """``read_state_changes(state_variable=)`` and ``(timers=True)`` read one store of a
    ``transform_with_state`` operator, as ``read_state`` does."""
    root = str(tmp_path / "ckpt")
    session_tracker_batches(spark, root, "feed", sqlite_catalog_url)
    feed = partial(read_state_changes, spark, root, 0, 0, 1, catalog_url=sqlite_catalog_url)

    def changes(**which: object) -> list[tuple[int, str, tuple[object, ...]]]:
        rows = feed(**which).collect()  # type: ignore[arg-type]
        return sorted((r.batch_id, r.change_type, tuple(r.key)) for r in rows)

    # two elements and the list's head, then one element and the head again
    assert changes(state_variable="amounts") == [
        (0, "update", (0, "a", -1)),
        (0, "update", (0, "a", 0)),
        (0, "update", (0, "a", 1)),
        (1, "update", (0, "a", -1)),
        (1, "update", (0, "a", 2)),
    ]
    # the timer set in batch 0 (1 ms after its time) fires and goes in batch 1, which sets one
    assert changes(timers=True) == [
        (0, "update", (0, "a", 1_001)),
        (1, "delete", (0, "a", 1_001)),
        (1, "update", (0, "a", 2_001)),
    ]
    with pytest.raises(InvalidArgument, match="not both"):
        feed(state_variable="amounts", timers=True)


COUNT = "k string, count bigint"


def test_append_runs_and_complete_is_refused_before_any_batch(tmp_path: Path) -> None:
    """Append gives the rows Update gives (the processor's rows, as they come); Complete is
    refused when the operator is built (Spark refuses it when the query starts:
    ``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION``, measured on Spark 4.3)."""
    update = Task(tmp_path / "update", RunningCount(), COUNT)
    append = Task(tmp_path / "append", RunningCount(), COUNT, output_mode="Append")
    assert append.op.output_mode == "append"
    for rows in ([("a", 1), ("b", 1), ("a", 1)], [("a", 1)], []):
        assert append.batch(rows) == update.batch(rows)
    with pytest.raises(InvalidArgument, match="'Complete'"):
        transform_with_state(0, ["k"], "k string", RunningCount(), COUNT, 1, output_mode="Complete")


class Declares(StatefulProcessor):
    """Declares a value with a TTL of one hour (``ttl``) or without, and for each key calls
    the timer method ``timer`` names (``registerTimer``, ``deleteTimer`` or ``listTimers``)."""

    def __init__(self, ttl: bool = False, timer: str | None = None) -> None:
        self.ttl, self.timer = ttl, timer

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.n = handle.getValueState("n", "n bigint", HOUR_MS if self.ttl else None)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        if self.timer == "listTimers":
            list(self.handle.listTimers())
        elif self.timer:
            getattr(self.handle, self.timer)(5_000)
        yield pd.DataFrame({"k": [key[0]], "count": [0]})


@pytest.mark.parametrize("time_mode", ["None", "EventTime"])
def test_a_ttl_outside_processing_time_is_refused(time_mode: str) -> None:
    """Spark's ``STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL``: when the operator
    is built."""
    with pytest.raises(
        InvalidArgument, match=f"TTL only with timeMode='ProcessingTime'.*{time_mode}"
    ):
        transform_with_state(
            0, ["k"], "k string", Declares(ttl=True), COUNT, 1, time_mode=time_mode
        )
    transform_with_state(
        0, ["k"], "k string", Declares(ttl=True), COUNT, 1, time_mode="processingTime"
    )


def test_an_unknown_time_mode_is_refused() -> None:
    """Spark's ``STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE`` (raised by ``transformWithState``
    itself, measured on Spark 4.3); both read the mode without regard to case."""
    with pytest.raises(InvalidArgument, match=r"time_mode must be one of.*'Sometimes'"):
        transform_with_state(0, ["k"], "k string", Declares(), COUNT, 1, time_mode="Sometimes")


@pytest.mark.parametrize("call", ["registerTimer", "deleteTimer", "listTimers"])
def test_a_timer_in_time_mode_none_is_refused(tmp_path: Path, call: str) -> None:
    """Spark's ``STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE``: in the
    task, on the first ``registerTimer``, ``deleteTimer`` or ``listTimers``."""
    task = Task(tmp_path, Declares(timer=call), COUNT)
    with pytest.raises(InvalidArgument, match=f"{call} needs timeMode"):
        task.batch([("a", 1)])
    timed = Task(tmp_path / "timed", Declares(timer=call), COUNT, time_mode="ProcessingTime")
    assert timed.batch([("a", 1)]) == [{"k": "a", "count": 0}]


CALLS: list[tuple[str, int]] = []


class Recorder(StatefulProcessor):
    """Records each call with the batch's processing time."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        handle.getValueState("n", "n bigint")
        self.at = -1

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        self.at = timerValues.getCurrentProcessingTimeInMs()
        CALLS.append(("rows", self.at))
        if key[0] == "t":
            self.handle.registerTimer(self.at + 1)
        yield pd.DataFrame({"k": [key[0]], "count": [0]})

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, info: Any) -> Iterator[Any]:
        self.at = timerValues.getCurrentProcessingTimeInMs()
        CALLS.append(("timer", self.at))
        return iter([])

    def close(self) -> None:
        CALLS.append(("close", self.at))


def test_close_is_called_once_per_partition_and_batch_after_the_timers(tmp_path: Path) -> None:
    """As Spark's worker (``COMPLETE``, after the data and the timers of the partition's
    batch): once per partition and batch, an idle batch included; the driver's ``init`` run
    (Spark's ``PRE_INIT``) closes its copy too."""
    CALLS.clear()
    task = Task(tmp_path, Recorder(), COUNT, time_mode="ProcessingTime")
    assert CALLS == [("close", -1)]  # the driver's run of init, which learns the variables
    CALLS.clear()
    task.batch([("a", 1), ("t", 1)], time_ms=1_000)
    task.batch([], time_ms=2_000)  # idle: the timer fires, then close
    task.batch([], time_ms=3_000)  # idle, nothing due
    assert CALLS == [
        ("rows", 1_000), ("rows", 1_000), ("close", 1_000),
        ("timer", 2_000), ("close", 2_000),
        ("close", -1),
    ]  # fmt: skip


class Lookup(StatefulProcessor):
    """A key with an amount of 1 puts 200 entries in its map; every key reads one entry."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("m", "i bigint", "v bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        if int(pd.concat(list(rows))["amount"].iloc[0]) == 1:
            for i in range(200):
                self.map.updateValue((i,), (i * 10,))
        (v,) = self.map.getValue((7,)) or (None,)
        yield pd.DataFrame({"k": [key[0]], "count": [v]})


def test_a_map_read_of_one_user_key_looks_up_that_entry_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``getValue`` is one lookup of one store key, never a scan of the key's map: every key
    the store is asked for is counted where all point reads end (``get``, ``lookup``: what
    ``get_many`` runs), and every read of many rows fails (``_blocks``, the row source of
    ``items``, ``range_scan``, ``to_arrow`` and a whole-state ``prefix_scan``; a clustered
    ``prefix_scan``, ``matching`` and the removals that scan)."""
    task = Task(tmp_path, Lookup(), COUNT)
    task.batch([("fill", 1)])
    keys_read: Counter[str] = Counter()
    original_get, original_lookup = StateStore.get, StateStore.lookup

    def get(self: StateStore, key: Any) -> Any:
        keys_read[self.store_id.store_name] += 1
        return original_get(self, key)

    def lookup(self: StateStore, keys: Any) -> Any:
        keys_read[self.store_id.store_name] += len(keys)
        return original_lookup(self, keys)

    def scan(self: StateStore, *_: Any) -> Any:
        raise AssertionError(f"a scan of {self.store_id.store_name}")

    monkeypatch.setattr(StateStore, "get", get)
    monkeypatch.setattr(StateStore, "lookup", lookup)
    scans = ["_blocks", "prefix_scan", "matching", "remove_matching", "remove_where"]
    for name in scans:
        monkeypatch.setattr(StateStore, name, scan)
    # one store key read: the grouping key "fill" and the user key 7
    assert task.batch([("fill", 2)]) == [{"k": "fill", "count": 70}]
    assert keys_read["m"] == 1


class Expiring(StatefulProcessor):
    """Two maps, TTL 1 ms (``short``) and one hour (``long``); an amount of 1 puts three
    entries in each; every key outputs how many entries each map has, and one read."""

    OUTPUT = "k string, short bigint, long bigint, got bigint"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.short = handle.getMapState("short", "i bigint", "v bigint", 1)
        self.long = handle.getMapState("long", "i bigint", "v bigint", HOUR_MS)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        if int(pd.concat(list(rows))["amount"].iloc[0]) == 1:
            for i in range(3):
                self.short.updateValue((i,), (i,))
                self.long.updateValue((i,), (i,))
        (got,) = self.short.getValue((1,)) or (None,)
        counts = {"short": len(list(self.short.keys())), "long": len(list(self.long.keys()))}
        yield pd.DataFrame({"k": [key[0]], **{n: [c] for n, c in counts.items()}, "got": [got]})


def test_map_entries_expire_after_their_ttl(tmp_path: Path) -> None:
    """A map's entries with a TTL of 1 ms are gone in the next batch (for every read, and
    from the store at the batch's end); those of an hour stay."""
    task = Task(tmp_path, Expiring(), Expiring.OUTPUT, time_mode="ProcessingTime")

    def stored(name: str) -> int:
        store = task.providers[name].get_read_store(task.version, task.ids[name])
        return int(store.to_arrow().num_rows)

    assert task.batch([("a", 1)], time_ms=1_000) == [{"k": "a", "short": 3, "long": 3, "got": 1}]
    assert (stored("short"), stored("long")) == (3, 3)  # expiring at 1_001: not yet
    assert task.batch([("a", 2)], time_ms=1_001) == [
        {"k": "a", "short": 0, "long": 3, "got": None}
    ]  # expired at 1_001: a TTL of 1 ms has passed by any later batch
    assert (stored("short"), stored("long")) == (0, 3)
    assert task.batch([("a", 2)], time_ms=1_000 + HOUR_MS - 1) == [
        {"k": "a", "short": 0, "long": 3, "got": None}
    ]


class LateHandle(StatefulProcessor):
    """Asks the handle for its declared value outside ``init``, and for an undeclared one
    when a key is ``undeclared``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        handle.getValueState("n", "n bigint")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        name = "m" if key[0] == "undeclared" else "n"
        count = self.handle.getValueState(name, "n bigint")
        (n,) = count.get() or (0,)
        count.update((n + 1,))
        yield pd.DataFrame({"k": [key[0]], "count": [n + 1]})


def test_the_handle_gives_a_declared_variable_outside_init(tmp_path: Path) -> None:
    """A deliberate difference: Spark refuses ``getValueState`` (and the other getters,
    ``deleteIfExists``) after ``init`` (``STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_
    INVALID_HANDLE_STATE``); ours hands the variable ``init`` declared (and
    ``deleteIfExists`` runs between keys: test_tws_batching.py's ``Mixed``). A name ``init``
    did not declare is refused."""
    task = Task(tmp_path, LateHandle(), COUNT)
    assert task.batch([("a", 1)]) == [{"k": "a", "count": 1}]
    assert task.batch([("a", 1)]) == [{"k": "a", "count": 2}]
    with pytest.raises(InvalidArgument, match="'m' was not declared"):
        task.batch([("undeclared", 1)])
