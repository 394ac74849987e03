"""The query the simulation runs and the plain-Python model of its state.

The query is one stateful operator whose update function adds each row's change to its key's
total (a schema change adds a ``hits`` count); :class:`Model` is what every committed batch's
state must be, the truth every step of the simulation is checked against (``platform.py``
drives the query, ``machine.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from state_runtime.runtime import StatefulOperator

KEYS = ("a", "b", "c", "d")
"""The model's keys: each is played in each partition by a key Spark routes there."""
FAIL_KEY = "__fail__"
"""An input row with this key makes the update function raise (a task failure)."""
INPUT = StructType(
    [
        StructField("k", StringType()),
        StructField("delta", LongType()),
        StructField("drop", BooleanType()),
    ]
)
VALUE_SCHEMAS = ("total bigint", "total bigint, hits bigint")
"""The state's value schema by generation: the schema change adds a nullable field."""

Change = int | None
"""A key's change in a batch: add this to its total, or None: remove the key."""
Batch = Mapping[int, Mapping[str, Change]]
"""A batch's input: partition -> key -> change (a partition left out changes nothing)."""
State = dict[str, tuple[Any, ...]]


class TaskFailed(RuntimeError):
    """The user's update function refused a row (a failed task)."""


def apply(state: State, changes: Mapping[str, Change], generation: int) -> State:
    """The model of the update function: what a batch does to one store's rows."""
    out = dict(state)
    for key, change in sorted(changes.items()):
        if change is None:
            out.pop(key, None)
            continue
        old = out.get(key)
        total = (old[0] if old else 0) + change
        if generation == 0:
            out[key] = (total,)
        else:
            hits = (old[1] if old and len(old) > 1 and old[1] is not None else 0) + 1
            out[key] = (total, hits)
    return out


def widen(state: State, generation: int) -> State:
    """A store's rows read under generation ``generation``'s schema (added fields are null)."""
    width = len(VALUE_SCHEMAS[generation].split(","))
    return {k: v + (None,) * (width - len(v)) for k, v in state.items()}


def _update(generation: int) -> Any:
    def update(store: Any, rows: pa.Table) -> list[tuple[Any, ...]]:
        out = []
        for key, delta, drop in zip(
            rows.column("k").to_pylist(),
            rows.column("delta").to_pylist(),
            rows.column("drop").to_pylist(),
            strict=True,
        ):
            if key.startswith(FAIL_KEY):
                raise TaskFailed("the update function refused a row")
            if drop:
                store.remove((key,))
                continue
            old = store.get((key,))
            total = (old[0] if old else 0) + delta
            if generation == 0:
                store.put((key,), (total,))
            else:
                hits = (old[1] if old and old[1] is not None else 0) + 1
                store.put((key,), (total, hits))
            out.append((key, total))
        return out

    return update


def operator(partitions: int, generation: int) -> StatefulOperator:
    return StatefulOperator(
        operator_id=0,
        key_columns=("k",),
        key_schema="k string",
        value_schema=VALUE_SCHEMAS[generation],
        output_schema="k string, total bigint",
        update=_update(generation),
        num_partitions=partitions,
    )


@dataclass
class Model:
    """What every committed batch's state must be: ``states[b][p]`` is partition ``p``'s rows
    after batch ``b``; ``last`` the query's last committed batch (None: none yet)."""

    partitions: int
    states: dict[int, list[State]] = field(default_factory=dict)
    last: int | None = None
    generation: int = 0

    def before(self, batch: int) -> list[State]:
        if batch == 0:
            return [{} for _ in range(self.partitions)]
        return self.states[batch - 1]

    def commit(self, batch: int, changes: Batch) -> None:
        base = self.before(batch)
        self.states[batch] = [
            apply(widen(state, self.generation), changes.get(p, {}), self.generation)
            for p, state in enumerate(base)
        ]
        self.rewind(batch)

    def repartition(self, partitions: int, route: Mapping[str, int]) -> None:
        """The last batch's rows moved to ``partitions`` stores by ``route`` (key ->
        partition): a repartition changes where each key lives, never its state."""
        assert self.last is not None
        moved: list[State] = [{} for _ in range(partitions)]
        for state in self.states[self.last]:
            for key, value in state.items():
                moved[route[key]][key] = value
        self.states[self.last] = moved
        self.partitions = partitions

    def rewind(self, batch: int, restarted: frozenset[int] = frozenset()) -> None:
        for later in [b for b in self.states if b > batch]:
            del self.states[later]
        for p in restarted:  # its state is lost: every batch up to here starts it from empty
            for b in [b for b in self.states if b <= batch]:
                if p < len(self.states[b]):  # a batch before a repartition may not have it
                    self.states[b][p] = {}
        self.last = batch

    def expected(self, batch: int, partition: int) -> State:
        return widen(self.states[batch][partition], self.generation)
