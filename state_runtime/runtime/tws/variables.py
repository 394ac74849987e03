"""State variables of a ``transform_with_state`` processor, each one store of the operator.

A processor declares its variables in ``init(handle)``; the driver runs ``init`` once on a copy
of the processor with a :class:`Declarations` handle to learn every variable's name, kind,
schemas and TTL (as Spark's ``PRE_INIT``), and each becomes a store named after the variable:

- value state: key = the grouping key, value = the user's fields;
- list state: key = (grouping key, ``__index``), value = the user's fields; a head row at
  index -1 holds the list's next index in ``__count``, so an append writes the new elements
  and the head only (never the whole list);
- map state: key = (grouping key, user key), value = the user's fields: reading one user key
  is one lookup of one entry.

A variable with a TTL stores each value's (element's, entry's) expiry in ``__expires_ms``:
``update``/``put``/``append``/``updateValue`` set it to the batch's processing time plus the
TTL; a value whose expiry is at or before the batch's time is gone for every read, and the
end of the batch removes it (Spark's ``StateTTL``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow.compute as pc
from pyspark.sql.types import LongType, StructField, StructType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import validate_name
from state_runtime.runtime.operator import ExtraStore
from state_runtime.store.arrow_rows import struct_rows
from state_runtime.store.keys import freeze_key
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

TIMERS_STORE = "tws-timers"
"""The operator's main store: its pending timers, key (grouping key, ``__expiry_ms``)."""
EXPIRY = "__expiry_ms"
TTL = "__expires_ms"
INDEX = "__index"
COUNT = "__count"
HEAD = -1
Kind = Literal["value", "list", "map"]
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Variable:
    """One declared state variable: what ``init`` asked the handle for."""

    name: str
    kind: Kind
    schema: StructType
    user_key: StructType | None = None
    ttl_ms: int | None = None

    def store(self, grouping: StructType) -> ExtraStore:
        """The variable's store: its key and value schemas (every stored field nullable)."""
        nullable = [StructField(f.name, f.dataType, True) for f in self.schema.fields]
        key = list(grouping.fields)
        extra: list[StructField] = []
        if self.kind == "list":
            key.append(StructField(INDEX, LongType(), False))
            extra.append(StructField(COUNT, LongType(), True))
        elif self.kind == "map":
            assert self.user_key is not None
            key += self.user_key.fields
        if self.ttl_ms is not None:
            extra.append(StructField(TTL, LongType(), True))
        names = [f.name for f in key]
        if len(set(names)) != len(names):
            raise InvalidArgument(
                f"state variable {self.name!r}: its key fields {names} repeat a name (a map's "
                "user key fields must differ from the grouping key's)"
            )
        value = StructType([*nullable, *extra])
        label = f"{self.kind} state variable {self.name!r}"
        return ExtraStore(self.name, StructType(key), value, label=label, drops_missing=True)


def deleted_store(name: str) -> ExtraStore:
    """The store of a variable ``init`` gives to ``deleteIfExists`` without declaring it
    (Spark removes its state): schemas are the catalog's, resolved when the query starts
    (:attr:`ExtraStore.deleted`); these are placeholders."""
    placeholder = StructType([StructField(INDEX, LongType(), True)])
    label = f"deleted state variable {name!r}"
    return ExtraStore(name, placeholder, placeholder, label=label, deleted=True)


def _schema(schema: StructType | str, what: str) -> StructType:
    parsed = parse_schema(schema)
    if not parsed.fields:
        raise InvalidArgument(f"{what}: a state schema needs at least one field")
    return parsed


class Declarations:
    """The handle ``init`` sees on the driver: it records the variables declared (Spark's
    ``PRE_INIT``); timers cannot be used there."""

    def __init__(self, time_mode: str) -> None:
        self.time_mode = time_mode
        self.variables: dict[str, Variable] = {}
        self._deleted: dict[str, None] = {}

    @property
    def deleted(self) -> tuple[str, ...]:
        """The variables given to ``deleteIfExists`` and not declared, in call order."""
        return tuple(n for n in self._deleted if n not in self.variables)

    def _declare(self, variable: Variable) -> None:
        validate_name(variable.name, "state variable name")
        if variable.name == TIMERS_STORE:
            raise InvalidArgument(f"state variable name {TIMERS_STORE!r} is reserved")
        if variable.ttl_ms is not None:
            if self.time_mode.lower() != "processingtime":
                raise InvalidArgument(
                    f"state variable {variable.name!r} has a TTL: Spark allows TTL only with "
                    f"timeMode='ProcessingTime', this operator has {self.time_mode!r}"
                )
            if variable.ttl_ms <= 0:
                raise InvalidArgument(f"state variable {variable.name!r}: TTL must be positive")
        known = self.variables.get(variable.name)
        if known is not None and known != variable:
            raise InvalidArgument(
                f"state variable {variable.name!r} is declared twice, differently"
            )
        self.variables[variable.name] = variable

    def getValueState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> None:
        self._declare(Variable(stateName, "value", _schema(schema, stateName), None, ttlDurationMs))

    def getListState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> None:
        self._declare(Variable(stateName, "list", _schema(schema, stateName), None, ttlDurationMs))

    def getMapState(
        self,
        stateName: str,
        userKeySchema: StructType | str,
        valueSchema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> None:
        user_key = _schema(userKeySchema, stateName)
        value = _schema(valueSchema, stateName)
        self._declare(Variable(stateName, "map", value, user_key, ttlDurationMs))

    def deleteIfExists(self, stateName: str) -> None:
        """Nothing to delete before the query runs: the name is recorded, so that the store
        of a variable no longer declared is opened in each task for the deletion."""
        validate_name(stateName, "state variable name")
        self._deleted[stateName] = None

    def registerTimer(self, expiryTimestampMs: int) -> None:
        raise InvalidArgument("timers cannot be registered in init()")

    deleteTimer = registerTimer

    def listTimers(self) -> Iterator[int]:
        raise InvalidArgument("timers cannot be listed in init()")


class Buffered:
    """One variable's store for a task: the values of the batch's keys read in one vectorised
    lookup (:meth:`prefetch`) and kept, the task's writes kept too and written in one
    :meth:`flush` (so a read between writes never turns the writes into a store run). Keys
    are told apart as the store does (:func:`freeze_key`: nested values, NaN)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._arity = store.schema.value_arity
        self._read: dict[Any, Row | None] = {}  # the store's values, as read
        self._changed: dict[Any, tuple[Row, Row | None]] = {}  # (key, value or None: removed)

    def prefetch(self, keys: Sequence[Row]) -> None:
        """Read ``keys`` in one lookup."""
        slots = {freeze_key(k): k for k in keys}
        missing = [k for s, k in slots.items() if s not in self._changed and s not in self._read]
        if missing:
            values = self.store.get_many(missing)
            self._read.update(zip(map(freeze_key, missing), values, strict=True))

    def get(self, key: Row) -> Row | None:
        slot = freeze_key(key)
        change = self._changed.get(slot)
        if change is not None:
            return change[1]
        if slot not in self._read:
            self._read[slot] = self.store.get(key)
        return self._read[slot]

    def get_many(self, keys: Sequence[Row]) -> list[Row | None]:
        self.prefetch(keys)
        changed, read = self._changed, self._read
        slots = [freeze_key(k) for k in keys]
        return [changed[s][1] if s in changed else read[s] for s in slots]

    def put(self, key: Row, value: Row) -> None:
        if len(value) != self._arity:
            self.store.put(key, value)  # raises the store's typed error
        self._changed[freeze_key(key)] = (key, value)

    def remove(self, key: Row) -> None:
        self._changed[freeze_key(key)] = (key, None)

    def flush(self) -> None:
        """Write the task's changes to the store, in one call."""
        if not self._changed:
            return
        changes = self._changed.values()
        self.store.apply(
            [(k, v) for k, v in changes if v is not None], [k for k, v in changes if v is None]
        )
        self._read.update((s, v) for s, (_, v) in self._changed.items())
        self._changed = {}

    def prefix_scan(self, prefix: Row) -> Iterator[tuple[Row, Row]]:
        self.flush()
        return self.store.prefix_scan(prefix)

    def remove_all(self) -> None:
        """Remove every value of the store."""
        self.flush()
        self.store.remove_matching(lambda keys, _values: pc.is_valid(keys))
        self._read.clear()


class Scope:
    """What the state objects of one task share: the variables' stores, the key being
    processed (Spark's implicit key) and the batch's processing time (for TTL)."""

    def __init__(self, stores: dict[str, Buffered], batch_time_ms: int) -> None:
        self.stores = stores
        self.batch_time_ms = batch_time_ms
        self.key: Row = ()

    def live(self, value: Row | None, ttl: bool) -> Row | None:
        """``value`` without its bookkeeping fields, None if absent or expired."""
        if value is None:
            return None
        if ttl:
            expires = value[-1]
            if expires is not None and expires <= self.batch_time_ms:
                return None
        return value

    def expiry(self, ttl_ms: int | None) -> tuple[Any, ...]:
        return () if ttl_ms is None else (self.batch_time_ms + ttl_ms,)


def _tuple(value: Any, what: str) -> Row:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise InvalidArgument(f"{what}: expected a tuple, got {type(value).__name__}")


class ValueState:
    """Spark's ``ValueState`` on the variable's store."""

    def __init__(self, scope: Scope, variable: Variable) -> None:
        self._scope, self._var = scope, variable
        self._store = scope.stores[variable.name]
        self._width = len(variable.schema.fields)

    def exists(self) -> bool:
        return self.get() is not None

    def get(self) -> Row | None:
        value = self._scope.live(self._store.get(self._scope.key), self._var.ttl_ms is not None)
        return None if value is None else value[: self._width]

    def update(self, newValue: Row) -> None:
        value = _tuple(newValue, self._var.name)
        self._store.put(self._scope.key, (*value, *self._scope.expiry(self._var.ttl_ms)))

    def clear(self) -> None:
        self._store.remove(self._scope.key)


class ListState:
    """Spark's ``ListState``: elements at (key, index), a head row with the next index."""

    def __init__(self, scope: Scope, variable: Variable) -> None:
        self._scope, self._var = scope, variable
        self._store = scope.stores[variable.name]
        self._width = len(variable.schema.fields)
        self._ttl = variable.ttl_ms is not None

    def _next_index(self) -> int:
        head = self._store.get((*self._scope.key, HEAD))
        return 0 if head is None else int(head[self._width])

    def _elements(self) -> Iterator[tuple[Row, Row]]:
        """(stored key, stored value) of each live element, in list order."""
        key = self._scope.key
        count = self._next_index()
        if not count:
            return
        keys = [(*key, i) for i in range(count)]
        for k, value in zip(keys, self._store.get_many(keys), strict=True):
            live = self._scope.live(value, self._ttl)
            if live is not None:
                yield k, live

    def exists(self) -> bool:
        return next(self._elements(), None) is not None

    def get(self) -> Iterator[Row]:
        return iter([value[: self._width] for _, value in self._elements()])

    def _row(self, value: Any) -> Row:
        padding = (None, *self._scope.expiry(self._var.ttl_ms))
        return (*_tuple(value, self._var.name), *padding)

    def _head(self, count: int) -> Row:
        return (*([None] * self._width), count, *([None] if self._ttl else []))

    def put(self, newState: Sequence[Row]) -> None:
        self.clear()
        self.appendList(newState)

    def appendValue(self, newState: Row) -> None:
        self.appendList([newState])

    def appendList(self, newState: Sequence[Row]) -> None:
        if not newState:
            return
        start = self._next_index()
        for i, value in enumerate(newState):
            self._store.put((*self._scope.key, start + i), self._row(value))
        self._store.put((*self._scope.key, HEAD), self._head(start + len(newState)))

    def clear(self) -> None:
        key = self._scope.key
        for i in range(self._next_index()):
            self._store.remove((*key, i))
        self._store.remove((*key, HEAD))


class MapState:
    """Spark's ``MapState``: one store entry per (grouping key, user key)."""

    def __init__(self, scope: Scope, variable: Variable) -> None:
        self._scope, self._var = scope, variable
        self._store = scope.stores[variable.name]
        self._width = len(variable.schema.fields)
        self._ttl = variable.ttl_ms is not None

    def _entries(self) -> Iterator[tuple[Row, Row]]:
        """(user key, value) of each live entry, in user key order."""
        prefix = len(self._scope.key)
        for key, value in self._store.prefix_scan(self._scope.key):
            live = self._scope.live(value, self._ttl)
            if live is not None:
                yield key[prefix:], live[: self._width]

    def exists(self) -> bool:
        return next(self._entries(), None) is not None

    def getValue(self, key: Row) -> Row | None:
        stored = self._store.get((*self._scope.key, *_tuple(key, self._var.name)))
        value = self._scope.live(stored, self._ttl)
        return None if value is None else value[: self._width]

    def containsKey(self, key: Row) -> bool:
        return self.getValue(key) is not None

    def updateValue(self, key: Row, value: Row) -> None:
        user_key = _tuple(key, self._var.name)
        stored = (*_tuple(value, self._var.name), *self._scope.expiry(self._var.ttl_ms))
        self._store.put((*self._scope.key, *user_key), stored)

    def iterator(self) -> Iterator[tuple[Row, Row]]:
        return iter(list(self._entries()))

    def keys(self) -> Iterator[Row]:
        return iter([k for k, _ in self._entries()])

    def values(self) -> Iterator[Row]:
        return iter([v for _, v in self._entries()])

    def removeKey(self, key: Row) -> None:
        self._store.remove((*self._scope.key, *_tuple(key, self._var.name)))

    def clear(self) -> None:
        for key, _ in list(self._store.prefix_scan(self._scope.key)):
            self._store.remove(key)


STATES: dict[Kind, type[ValueState | ListState | MapState]] = {
    "value": ValueState,
    "list": ListState,
    "map": MapState,
}


def expire(buffered: Buffered, variable: Variable, batch_time_ms: int) -> int:
    """Write the task's changes, and remove the variable's values whose TTL passed at
    ``batch_time_ms`` (a list's head goes with its last element); the number of values
    removed."""
    buffered.flush()
    store = buffered.store
    if variable.ttl_ms is None:
        return 0
    removed = store.remove_matching(
        lambda _keys, values: pc.less_equal(pc.struct_field(values, TTL), batch_time_ms)
    )
    if variable.kind == "list" and removed.num_rows:
        width = len(store.schema.key.fields) - 1
        keys = struct_rows(removed.column("key").combine_chunks())
        for key in {k[:width] for k in keys if k is not None}:
            if all(k[-1] == HEAD for k, _ in store.prefix_scan(key)):
                store.remove((*key, HEAD))
    return int(removed.num_rows)
