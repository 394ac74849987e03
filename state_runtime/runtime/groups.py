"""``map_groups_with_state``: a user function per key with its state, timeouts and TTL.

As with Spark's ``mapGroupsWithState`` (and Spark Streaming's ``mapWithState``), the function
sees one key, that key's new rows in the batch and a :class:`GroupState`. A key may be given
a timeout; a key whose timeout has passed at a later batch gets one more call with no rows
and ``has_timed_out`` set, and is then removed unless the function updates it. ``ttl`` gives
every key a timeout renewed on each update. The stored state of the batch's keys is read in
one vectorised lookup; finding expired keys is one vectorised pass over the partition's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StructField, StructType

from state_runtime.arrow_rows import struct_rows
from state_runtime.config import StoreConfig
from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.context import current_batch
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.schema import parse_schema
from state_runtime.store import StateStore

TIMEOUT_FIELD = "__timeout_at_ms"

GroupFunction = Callable[
    [tuple[Any, ...], list[tuple[Any, ...]], "GroupState"], Iterable[tuple[Any, ...]] | None
]


class GroupState:
    """One key's state inside a ``map_groups_with_state`` call."""

    def __init__(self, value: tuple[Any, ...] | None, batch_time_ms: int, timed_out: bool) -> None:
        self._value = value
        self._changed = False
        self._removed = False
        self.timeout_at_ms: int | None = None
        self.batch_time_ms = batch_time_ms
        self.has_timed_out = timed_out

    @property
    def exists(self) -> bool:
        return self._value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self._value

    def update(self, value: tuple[Any, ...]) -> None:
        self._value = value
        self._changed = True
        self._removed = False

    def remove(self) -> None:
        self._value = None
        self._removed = True

    def set_timeout_duration(self, duration: timedelta | int) -> None:
        """Time the key out ``duration`` (or that many ms) after this batch's time."""
        ms = int(duration.total_seconds() * 1000) if isinstance(duration, timedelta) else duration
        if ms <= 0:
            raise InvalidArgument(f"timeout duration must be positive, got {duration!r}")
        self.timeout_at_ms = self.batch_time_ms + ms


@dataclass(frozen=True)
class _GroupsWithState:
    key_columns: tuple[str, ...]
    func: GroupFunction
    ttl_ms: int | None

    def __call__(self, store: StateStore, rows: pa.Table) -> Iterator[tuple[Any, ...]]:
        batch_time = current_batch().batch_time_ms
        key_idx = [rows.column_names.index(c) for c in self.key_columns]
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        columns = [rows.column(i).to_pylist() for i in range(rows.num_columns)]
        for row in zip(*columns, strict=True):
            groups.setdefault(tuple(row[i] for i in key_idx), []).append(row)
        stored = store.get_many(groups)  # one vectorised lookup for the batch's keys
        for (key, key_rows), value in zip(groups.items(), stored, strict=True):
            yield from self._call(store, key, value, key_rows, batch_time, timed_out=False)
        for key, value in self._expired(store, batch_time):
            if key not in groups:
                yield from self._call(store, key, value, [], batch_time, timed_out=True)

    @staticmethod
    def _expired(
        store: StateStore, batch_time: int
    ) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """Keys whose timeout has passed, found with one vectorised pass over the state."""
        state = store.to_arrow()
        timeout = state.column("value").combine_chunks().flatten()[-1]
        due = pc.fill_null(pc.less_equal(timeout, batch_time), False)
        if not pc.any(due).as_py():
            return []
        expired = state.filter(due)
        keys = struct_rows(expired.column("key").combine_chunks())
        values = struct_rows(expired.column("value").combine_chunks())
        return [
            (k, v) for k, v in zip(keys, values, strict=True) if k is not None and v is not None
        ]

    def _call(
        self,
        store: StateStore,
        key: tuple[Any, ...],
        stored: tuple[Any, ...] | None,
        rows: list[tuple[Any, ...]],
        batch_time: int,
        *,
        timed_out: bool,
    ) -> Iterator[tuple[Any, ...]]:
        state = GroupState(None if stored is None else stored[:-1], batch_time, timed_out)
        if stored is not None and not timed_out:
            state.timeout_at_ms = stored[-1]
        out = self.func(key, rows, state)
        if out is not None:
            yield from out
        if state._removed or (timed_out and not state._changed):
            store.remove(key)
            return
        if state._changed or (state.exists and state.timeout_at_ms != (stored or (None,))[-1]):
            timeout = state.timeout_at_ms
            if self.ttl_ms is not None and state._changed:
                timeout = batch_time + self.ttl_ms
            assert state._value is not None
            store.put(key, (*state._value, timeout))


def map_groups_with_state(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str | StructType,
    state_schema: str | StructType,
    output_schema: str | StructType,
    func: GroupFunction,
    num_partitions: int,
    *,
    ttl: timedelta | None = None,
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
) -> StatefulOperator:
    """An operator calling ``func(key, rows, state)`` per key with new rows, and once more for
    each key whose timeout (or ``ttl`` since its last update) has passed."""
    state_struct = parse_schema(state_schema)
    if TIMEOUT_FIELD in state_struct.names:
        raise InvalidArgument(f"state field name {TIMEOUT_FIELD!r} is reserved")
    stored = StructType([*state_struct.fields, StructField(TIMEOUT_FIELD, LongType(), True)])
    ttl_ms = None if ttl is None else int(ttl.total_seconds() * 1000)
    if ttl_ms is not None and ttl_ms <= 0:
        raise InvalidArgument(f"ttl must be positive, got {ttl}")
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(key_columns),
        key_schema=key_schema,
        value_schema=stored,
        output_schema=output_schema,
        update=_GroupsWithState(tuple(key_columns), func, ttl_ms),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
    )
