"""Store instances: a read-only view of a committed version, and a writable one.

Keys and values are tuples matching the key and value schemas (``Row`` works, being a
tuple). For a single-column schema a bare scalar is accepted and wrapped. Reads return
tuples. Updates stay private to the instance until :meth:`StateStore.commit`, which writes
one delta file and makes the new version visible; :meth:`StateStore.abort` discards them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from state_runtime.checkpoint import CheckpointInfo
from state_runtime.checkpoint_format import (
    FileHeader,
    checksum,
    encode,
    now,
    rows_of,
    rows_to_table,
)
from state_runtime.errors import CannotCommit, InvalidArgument, StorageError, StoreClosed
from state_runtime.identity import CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.metrics import LoadMetrics, StoreMetrics
from state_runtime.versions import ABSENT, Diff, Key, Value, VersionView, count_row_change

if TYPE_CHECKING:
    from state_runtime.provider import StateStoreProvider


def _normalize(row: Any, arity: int, what: str, store: StoreId) -> tuple[Any, ...]:
    if type(row) is tuple or isinstance(row, tuple):
        if len(row) != arity:
            raise InvalidArgument(
                f"{what} {row!r} has {len(row)} fields, the {what} schema has {arity}", store=store
            )
        return tuple(row)
    if arity == 1 and row is not None and not isinstance(row, list | dict):
        return (row,)
    raise InvalidArgument(f"{what} {row!r} is not a tuple of {arity} fields", store=store)


class ReadStateStore:
    """A committed version of a store, read-only."""

    def __init__(self, provider: StateStoreProvider, view: VersionView, load: LoadMetrics) -> None:
        self._provider = provider
        self._view = view
        self._key_arity = provider.schema.key_arity
        self._value_arity = provider.schema.value_arity
        self.metrics = StoreMetrics(rows=view.rows, load=load)

    @property
    def store_id(self) -> StoreId:
        return self._provider.store_id

    @property
    def version(self) -> int:
        """The committed version this instance was opened at."""
        return self._view.ref.version

    @property
    def checkpoint_id(self) -> str | None:
        return self._view.ref.checkpoint_id

    def _key(self, key: Any) -> Key:
        if type(key) is tuple and len(key) == self._key_arity:
            return key
        return _normalize(key, self._key_arity, "key", self.store_id)

    def get(self, key: Any) -> Value | None:
        """The value of ``key``, or None."""
        return self._view.get(self._key(key))

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return self._view.rows

    def items(self) -> Iterator[tuple[Key, Value]]:
        """Every (key, value) row, in no particular order."""
        return self._view.items()

    __iter__ = items

    def prefix_scan(self, prefix: Any) -> Iterator[tuple[Key, Value]]:
        """Rows whose leading key columns equal ``prefix`` (a tuple), in key order.

        Cost is one pass over the state (there is no secondary index).
        """
        p = prefix if isinstance(prefix, tuple) else (prefix,)
        if not 0 < len(p) <= self._key_arity:
            raise InvalidArgument(f"prefix {prefix!r} must have 1..{self._key_arity} fields")
        n = len(p)
        return iter(_sorted([(k, v) for k, v in self.items() if k[:n] == p]))

    def range_scan(self, start: Any = None, end: Any = None) -> Iterator[tuple[Key, Value]]:
        """Rows with ``start <= key < end`` (either bound may be None), in key order.

        Bounds may be key prefixes; keys compare as tuples. Cost is one pass plus a sort.
        """
        lo = None if start is None else (start if isinstance(start, tuple) else (start,))
        hi = None if end is None else (end if isinstance(end, tuple) else (end,))
        rows = [
            (k, v)
            for k, v in self.items()
            if (lo is None or k[: len(lo)] >= lo) and (hi is None or k[: len(hi)] < hi)
        ]
        return iter(_sorted(rows))

    def to_arrow(self) -> pa.Table:
        """The state as an Arrow table with ``key`` and ``value`` struct columns."""
        rows = list(self.items())
        return rows_to_table([k for k, _ in rows], [v for _, v in rows], self._provider.schema)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store_id}, version={self.version})"


def _sorted(rows: list[tuple[Key, Value]]) -> list[tuple[Key, Value]]:
    try:
        return sorted(rows, key=lambda kv: kv[0])
    except TypeError as e:  # None or unorderable key columns
        raise InvalidArgument(f"keys cannot be ordered for a scan: {e}") from e


class _State(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


class StateStore(ReadStateStore):
    """A writable store on top of committed version ``version``; commits ``version + 1``."""

    def __init__(self, provider: StateStoreProvider, view: VersionView, load: LoadMetrics) -> None:
        super().__init__(provider, view, load)
        self._changes: Diff = {}
        self._state = _State.OPEN
        self._info: CheckpointInfo | None = None

    # --- reads see this instance's own updates -----------------------------------------

    def get(self, key: Any) -> Value | None:
        k = self._key(key)
        change = self._changes.get(k)
        if change is not None:
            return None if change is ABSENT else change  # type: ignore[return-value]
        return self._view.get(k)

    def __len__(self) -> int:
        return self._view.rows + count_row_change(self._view, self._changes)

    def items(self) -> Iterator[tuple[Key, Value]]:
        changes = self._changes
        if not changes:
            yield from self._view.items()
            return
        for key, value in self._view.items():
            if key not in changes:
                yield key, value
        for key, change in list(changes.items()):
            if change is not ABSENT:
                yield key, change  # type: ignore[misc]

    __iter__ = items

    # --- updates ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise StoreClosed(
                f"store already {self._state.value}; open a new store to update",
                store=self.store_id,
                version=self.version,
            )

    def _value(self, value: Any) -> Value:
        if type(value) is tuple and len(value) == self._value_arity:
            return value
        return _normalize(value, self._value_arity, "value", self.store_id)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` in the version being built."""
        self._check_open()
        self._changes[self._key(key)] = self._value(value)

    def remove(self, key: Any) -> None:
        """Remove ``key`` (a no-op if absent)."""
        self._check_open()
        self._changes[self._key(key)] = ABSENT

    def remove_where(self, predicate: Callable[[Key, Value], bool]) -> int:
        """Remove every row for which ``predicate(key, value)`` is true; returns the count."""
        self._check_open()
        doomed = [k for k, v in self.items() if predicate(k, v)]
        for k in doomed:
            self._changes[k] = ABSENT
        return len(doomed)

    def apply(
        self,
        puts: Iterable[tuple[Any, Any]] = (),
        removes: Iterable[Any] = (),
    ) -> None:
        """Apply many puts, then many removes, in one call."""
        self._check_open()
        key, value, changes = self._key, self._value, self._changes
        for k, v in puts:
            changes[key(k)] = value(v)
        for k in removes:
            changes[key(k)] = ABSENT

    def apply_arrow(self, data: pa.Table | pa.RecordBatch) -> None:
        """Apply rows in the checkpoint layout: a ``key`` and a ``value`` struct column.

        A null ``value`` removes the key. Field order and types must match the schemas.
        """
        self._check_open()
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        schema = self._provider.schema
        if (
            table.column_names[:2] != ["key", "value"]
            or table.schema.field("key").type != schema.key_arrow
            or table.schema.field("value").type != schema.value_arrow
        ):
            raise InvalidArgument(
                f"arrow data must have columns key {schema.key_arrow} and value "
                f"{schema.value_arrow}; got {table.schema}",
                store=self.store_id,
            )
        self._changes.update((k, ABSENT if v is None else v) for k, v in rows_of(table).items())

    def updates(self) -> Iterator[tuple[Key, Value | None]]:
        """This version's changes: (key, new value), or (key, None) for a removal."""
        for key, change in self._changes.items():
            yield key, (None if change is ABSENT else change)  # type: ignore[misc]

    # --- transaction --------------------------------------------------------------------

    @property
    def has_committed(self) -> bool:
        return self._state is _State.COMMITTED

    @property
    def checkpoint_info(self) -> CheckpointInfo | None:
        """What :meth:`commit` returned, once committed."""
        return self._info

    def commit(self) -> CheckpointInfo:
        """Write ``<version+1>_<new id>.delta`` and make the new version current.

        Never overwrites a file; a concurrent attempt at the same version gets its own id.
        On failure nothing becomes visible, the store is aborted and CannotCommit is raised.
        """
        self._check_open()
        started = time.perf_counter()
        provider, base, changes = self._provider, self._view, self._changes
        ref = CheckpointRef(base.ref.version + 1, new_checkpoint_id())
        assert ref.checkpoint_id is not None
        lineage = provider.lineage_for_child(base)
        rows = base.rows + count_row_change(base, changes)
        path = self.store_id.file_path(ref.version, ref.checkpoint_id, FileKind.DELTA)
        header = FileHeader(
            FileKind.DELTA,
            self.store_id,
            ref.version,
            ref.checkpoint_id,
            lineage,
            provider.schema,
            len(changes),
            rows,
            now(),
        )
        values = [None if v is ABSENT else v for v in changes.values()]
        try:
            data = encode(
                header,
                list(changes.keys()),
                values,  # type: ignore[arg-type]
                provider.config.compression,
                provider.config.compression_level,
            )
            provider.storage.write_if_absent(path, data)
        except (pa.ArrowException, TypeError, ValueError, OverflowError, StorageError) as e:
            self._state = _State.ABORTED
            raise CannotCommit(
                f"commit failed, nothing was made visible: {e}",
                store=self.store_id,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=path,
            ) from e
        removed = sum(1 for v in values if v is None)
        self._view = provider.install(base, changes, ref, lineage, rows)
        self._changes = {}
        self._state = _State.COMMITTED
        elapsed = (time.perf_counter() - started) * 1000
        self.metrics.rows = rows
        self.metrics.updated_keys = len(values) - removed
        self.metrics.removed_keys = removed
        self.metrics.bytes_written = len(data)
        self.metrics.commit_ms = elapsed
        self._info = CheckpointInfo(
            store=self.store_id,
            version=ref.version,
            checkpoint_id=ref.checkpoint_id,
            base_checkpoint_id=base.ref.checkpoint_id,
            lineage=lineage,
            kind=FileKind.DELTA,
            path=path,
            rows=rows,
            file_rows=len(values),
            bytes_written=len(data),
            checksum=checksum(data),
            created_at=header.created_at,
            timings_ms={"load": self.metrics.load.load_ms, "commit": elapsed},
        )
        return self._info

    def abort(self) -> None:
        """Discard this version's updates; no file is written. Idempotent after commit/abort."""
        if self._state is _State.OPEN:
            self._changes = {}
            self._state = _State.ABORTED
