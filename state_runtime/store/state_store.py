"""Store instances: a read-only view of a committed version, and a writable one.

Keys and values are tuples matching the key and value schemas (``Row`` works, being a
tuple). For a single-column schema a bare scalar is accepted and wrapped. Reads return
tuples. Updates stay private to the instance until :meth:`StateStore.commit`, which writes
one delta file and makes the new version visible; :meth:`StateStore.abort` discards them.

Two ways in: the per-key API (``get``, ``put``, ``remove``, iteration) for user functions,
and the bulk API (``lookup``, ``apply_arrow``, ``to_arrow``) that moves whole Arrow columns
through the columnar state without a Python object per row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa

from state_runtime.errors import (
    CannotCommit,
    InvalidArgument,
    LocalDiskFull,
    LocalRunDamaged,
    StorageError,
    StoreClosed,
)
from state_runtime.identity import CheckpointRef, FileKind, StoreId, new_checkpoint_id
from state_runtime.store.arrow_rows import Row, struct_array, struct_rows
from state_runtime.store.change_runs import ChangeRuns
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.config import StoreConfig
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer, freeze
from state_runtime.store.run_levels import AnyRun, disk_metrics, held_bytes
from state_runtime.store.run_writer import written
from state_runtime.store.scans import (
    ArrowPredicate,
    as_prefix,
    key_ordered,
    key_ordered_rows,
    matching_rows,
    prefix_mask,
    range_mask,
)
from state_runtime.store.sorted_runs import Run, concat
from state_runtime.store.state_schema import StateSchema
from state_runtime.store.store_metrics import LoadMetrics, StoreMetrics
from state_runtime.store.streamed_writer import write_delta
from state_runtime.store.versions import LookupMemo, Version, get, live_blocks, lookup, row_change
from state_runtime.store.writer import CheckpointTarget, record_unchanged


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()
"""Marks a removed key in a store's pending per-key changes."""


class _Unhashable:
    """A key holding lists or dicts (array and map columns), as a dict key."""

    __slots__ = ("frozen", "key")

    def __init__(self, key: Row) -> None:
        self.key = key
        self.frozen = freeze(key)

    def __hash__(self) -> int:
        return hash(self.frozen)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Unhashable) and self.frozen == other.frozen


class _Changes(dict[Any, "Row | _Absent"]):
    """Per-key changes in order of arrival; keys with unhashable parts are wrapped."""

    def set(self, key: Row, change: Row | _Absent) -> None:
        try:
            self[key] = change
        except TypeError:
            self[_Unhashable(key)] = change

    def find(self, key: Row) -> Row | _Absent | None:
        try:
            return self.get(key)
        except TypeError:
            return self.get(_Unhashable(key))

    def keys_as_rows(self) -> list[Row]:
        return [k.key if isinstance(k, _Unhashable) else k for k in self]


class StoreHost(Protocol):
    """What a store needs from the provider that opened it."""

    @property
    def store_id(self) -> StoreId: ...

    @property
    def schema(self) -> StateSchema: ...

    @property
    def indexer(self) -> KeyIndexer: ...

    @property
    def checkpoints(self) -> CheckpointTarget: ...

    def lineage_for_child(self, parent: Version) -> tuple[CheckpointRef, ...]: ...

    def install(self, version: Version) -> None: ...


def _normalize(row: Any, arity: int, what: str, store: StoreId) -> Row:
    if isinstance(row, tuple):
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

    def __init__(self, host: StoreHost, version: Version, load: LoadMetrics) -> None:
        self._host = host
        self._version = version
        self._indexer = host.indexer
        self._key_arity = host.schema.key_arity
        self._value_arity = host.schema.value_arity
        self.metrics = StoreMetrics(rows=version.rows, load=load)
        self._disk_at_open = LOCAL_DISK.snapshot()

    @property
    def store_id(self) -> StoreId:
        return self._host.store_id

    @property
    def schema(self) -> StateSchema:
        """The key and value schemas (Spark and Arrow forms)."""
        return self._host.schema

    @property
    def config(self) -> StoreConfig:
        """The settings of the provider that opened this store."""
        return self._host.checkpoints.config

    @property
    def version(self) -> int:
        """The committed version this instance was opened at."""
        return self._version.ref.version

    @property
    def checkpoint_id(self) -> str | None:
        return self._version.ref.checkpoint_id

    def _key(self, key: Any) -> Row:
        if type(key) is tuple and len(key) == self._key_arity:
            return key
        return _normalize(key, self._key_arity, "key", self.store_id)

    def _runs(self) -> tuple[AnyRun, ...]:
        """The state as a stack of runs, newest first."""
        return self._version.runs

    def _blocks(self) -> Iterator[Run]:
        """The state's rows in index order, block by block (one block when in memory)."""
        return self._version.blocks()

    def get(self, key: Any) -> Row | None:
        """The value of ``key``, or None."""
        return self._version.get(self._key(key))

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return self._version.rows

    def items(self) -> Iterator[tuple[Row, Row]]:
        """Every (key, value) row, in no particular order."""
        for block in self._blocks():
            for key, value in block.rows():
                assert value is not None
                yield key, value

    __iter__ = items

    def lookup(self, keys: pa.StructArray | pa.ChunkedArray) -> pa.StructArray:
        """The values of many keys at once (a ``key`` struct array); null where absent."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if keys.type != self._host.schema.key_arrow:
            raise InvalidArgument(
                f"keys must have type {self._host.schema.key_arrow}, got {keys.type}",
                store=self.store_id,
            )
        return lookup(self._indexer, self._runs(), keys, self._host.schema.value_arrow)

    def get_many(self, keys: Iterable[Any]) -> list[Row | None]:
        """The values of many Python keys in one vectorised lookup (None where absent)."""
        normalized = [self._key(k) for k in keys]
        try:
            arrow_keys = self._indexer.to_arrow(normalized)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise InvalidArgument(f"a key does not fit the key schema: {e}") from e
        return struct_rows(self.lookup(arrow_keys))

    def prefix_scan(self, prefix: Any) -> Iterator[tuple[Row, Row]]:
        """Rows whose leading key columns equal ``prefix`` (a tuple; a None field matches
        null), in key order.

        With a clustering prefix (``StoreConfig.scan_prefix``) no shorter than ``prefix``:
        one range of index keys per run, found by binary search (:meth:`_span`); else one
        vectorised pass over the state, block by block.
        """
        bound = as_prefix(prefix, self._key_arity, "prefix", nulls=True)
        span = self._indexer.prefix_span(bound)
        blocks = self._blocks() if span is None else [self._span(*span)]
        return key_ordered_rows(blocks, prefix_mask(bound), self._host.schema)

    def _span(self, lo: int, hi: int) -> Run:
        """The live rows whose index key is in ``[lo, hi]``: each run's rows there, then
        their current values (a newer run may have changed or removed them)."""
        runs = self._runs()
        parts = [run.between(lo, hi) for run in runs]
        if len(parts) == 1 and not parts[0].values.null_count:
            return parts[0]
        schema = self._host.schema
        keys = pa.concat_arrays([p.keys for p in parts])
        unique = Run.build(self._indexer, keys, pa.nulls(len(keys), schema.value_arrow))[0].keys
        values = lookup(self._indexer, runs, unique, schema.value_arrow)
        live = values.is_valid()
        return Run(
            np.zeros(len(unique) - values.null_count), unique.filter(live), values.filter(live)
        )

    def range_scan(self, start: Any = None, end: Any = None) -> Iterator[tuple[Row, Row]]:
        """Rows with ``start <= key < end`` (either bound may be None), in key order.

        Bounds may be key prefixes; keys compare as tuples. One vectorised pass plus a sort.
        """
        lo = None if start is None else as_prefix(start, self._key_arity, "start")
        hi = None if end is None else as_prefix(end, self._key_arity, "end")
        return key_ordered_rows(self._blocks(), range_mask(lo, hi), self._host.schema)

    def matching(self, predicate: ArrowPredicate) -> pa.Table:
        """The current rows for which ``predicate(keys, values)`` (a boolean array) holds.

        One vectorised pass per run, without merging the runs into one state: a run's rows
        that match are candidates; a lookup of the candidates' current values and a second
        evaluation keep exactly the live rows that match (a newer run may have changed or
        removed a candidate). Returns a table with ``key`` and ``value`` struct columns.
        """
        runs = self._runs()
        if len(runs) == 1 and isinstance(runs[0], Run):  # the base alone: the answer
            return matching_rows(predicate, runs[0].keys, runs[0].values)
        schema = self._host.schema
        found = [
            matching_rows(predicate, block.keys, block.values)
            for run in runs
            for block in run.blocks()
        ]
        keys = pa.concat_arrays([t.column("key").combine_chunks() for t in found])
        if not len(keys):
            return found[0]
        if len(runs) == 1:  # one run without removals: its matching rows are the answer
            return pa.concat_tables(found)
        unique = Run.build(self._indexer, keys, pa.nulls(len(keys), schema.value_arrow))[0].keys
        values = lookup(self._indexer, runs, unique, schema.value_arrow)
        return matching_rows(predicate, unique, values)

    def to_arrow(self) -> pa.Table:
        """The state as an Arrow table with ``key`` and ``value`` struct columns.

        A state with runs on local disk is merged block by block into a local file, and the
        table maps that file (its pages are the file's, not the worker's heap)."""
        blocks = self._blocks()
        first = next(blocks, None)
        second = next(blocks, None)
        if first is None or second is None:
            schema = self._host.schema
            state = first or Run.empty(schema.key_arrow, schema.value_arrow)
            return pa.table({"key": state.keys, "value": state.values})
        on_disk = written(
            self.store_id,
            itertools.chain([first, second], blocks),
            self._host.schema.key_arrow,
            self._host.schema.value_arrow,
            sum(held_bytes(run) for run in self._runs()),
            compaction=False,
        )
        return (
            on_disk.table()
            if not isinstance(on_disk, Run)
            else pa.table({"key": on_disk.keys, "value": on_disk.values})
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store_id}, version={self.version})"


class _State(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


class StateStore(ReadStateStore):
    """A writable store on top of committed version ``version``; commits ``version + 1``."""

    def __init__(self, host: StoreHost, version: Version, load: LoadMetrics) -> None:
        super().__init__(host, version, load)
        self._puts = _Changes()  # per-key changes since the last flush
        self._pending = ChangeRuns(self._indexer, self.store_id)  # flushed changes
        self._looked_up = LookupMemo(self._indexer)  # the version's answers, for the commit
        self._status = _State.OPEN
        self._info: CheckpointInfo | None = None

    # --- this instance's changes as runs ------------------------------------------------

    def _flush(self) -> None:
        """Turn the per-key changes into a change run (Arrow errors for values that do not
        fit the schema propagate)."""
        if not self._puts:
            return
        schema = self._host.schema
        keys = struct_array(self._puts.keys_as_rows(), schema.key_arrow)
        values = struct_array(
            [None if v is ABSENT else v for v in self._puts.values()],  # type: ignore[misc]
            schema.value_arrow,
        )
        run, _ = Run.build(self._indexer, keys, values)
        self._pending.push(run)
        self._puts = _Changes()

    def _flushed(self) -> None:
        try:
            self._flush()
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise InvalidArgument(
                f"a value does not fit the schema: {e}", store=self.store_id
            ) from e

    def _changes(self) -> AnyRun:
        """This version's changes as one change run (empty when there are none)."""
        self._flush()
        if not self._pending:
            schema = self._host.schema
            return Run.empty(schema.key_arrow, schema.value_arrow)
        return self._pending.squashed()

    def _runs(self) -> tuple[AnyRun, ...]:
        self._flushed()
        return (*self._pending.runs, *self._version.runs)

    def _blocks(self) -> Iterator[Run]:
        runs = self._runs()
        if not self._pending:
            return self._version.blocks()
        return live_blocks(self._indexer, runs, self._version.store)

    # --- reads see this instance's own updates -----------------------------------------

    def lookup(self, keys: pa.StructArray | pa.ChunkedArray) -> pa.StructArray:
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        values = super().lookup(keys)
        if not self._pending:  # no change yet: these are the version's own answers
            self._looked_up.add(keys, values)
        return values

    def get(self, key: Any) -> Row | None:
        k = self._key(key)
        change = self._puts.find(k)
        if change is not None:
            return None if change is ABSENT else change  # type: ignore[return-value]
        if not self._pending:
            return self._version.get(k)
        return get(self._indexer, self._runs(), k)

    def __len__(self) -> int:
        self._flushed()
        if not self._pending:
            return self._version.rows
        changes = self._pending.squashed()
        return self._version.rows + row_change(self._indexer, self._version.runs, changes)

    # --- updates ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._status is not _State.OPEN:
            raise StoreClosed(
                f"store already {self._status.value}; open a new store to update",
                store=self.store_id,
                version=self.version,
            )

    def _value(self, value: Any) -> Row:
        if type(value) is tuple and len(value) == self._value_arity:
            return value
        return _normalize(value, self._value_arity, "value", self.store_id)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` in the version being built."""
        self._check_open()
        self._puts.set(self._key(key), self._value(value))

    def remove(self, key: Any) -> None:
        """Remove ``key`` (a no-op if absent)."""
        self._check_open()
        self._puts.set(self._key(key), ABSENT)

    def remove_where(self, predicate: Callable[[Row, Row], bool]) -> int:
        """Remove every row for which ``predicate(key, value)`` is true; returns the count."""
        self._check_open()
        doomed = [k for k, v in self.items() if predicate(k, v)]
        for k in doomed:
            self._puts.set(k, ABSENT)
        return len(doomed)

    def remove_matching(self, predicate: ArrowPredicate) -> pa.Table:
        """Remove every row for which ``predicate(keys, values)`` holds, in one bulk update
        (see :meth:`matching`); returns the removed rows (``key`` and ``value`` columns)."""
        self._check_open()
        doomed = self.matching(predicate)
        if doomed.num_rows:
            keys = doomed.column("key").combine_chunks()
            self.apply_arrow(
                pa.table({"key": keys, "value": pa.nulls(len(keys), self._host.schema.value_arrow)})
            )
        return doomed

    def apply(
        self,
        puts: Iterable[tuple[Any, Any]] = (),
        removes: Iterable[Any] = (),
    ) -> None:
        """Apply many puts, then many removes, in one call."""
        self._check_open()
        key, value, changes = self._key, self._value, self._puts
        for k, v in puts:
            changes.set(key(k), value(v))
        for k in removes:
            changes.set(key(k), ABSENT)

    def apply_arrow(self, data: pa.Table | pa.RecordBatch) -> None:
        """Apply rows in the checkpoint layout: a ``key`` and a ``value`` struct column.

        A null ``value`` removes the key; of rows with equal keys the last wins. Field order
        and types must match the schemas. Costs O(rows log rows), no Python object per row.
        ``LocalDiskFull`` (no room to spill the changes past the budget) comes after the rows
        were applied: they stay, in memory (docs/state-on-disk.md).
        """
        self._check_open()
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        schema = self._host.schema
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
        keys = table.column("key").combine_chunks()
        if keys.null_count:
            raise InvalidArgument("arrow data holds null keys", store=self.store_id)
        self._flushed()
        run, _ = Run.build(self._indexer, keys, table.column("value").combine_chunks())
        self._pending.push(run)

    def updates(self) -> Iterator[tuple[Row, Row | None]]:
        """This version's changes: (key, new value), or (key, None) for a removal; in key
        order where the key type has one."""
        self._flushed()
        if not self._pending:
            return
        changes = self._pending.squashed()
        if self._indexer.exact:  # index order is key order
            for block in changes.blocks():
                yield from block.rows()
            return
        whole = concat(list(changes.blocks()), changes.key_type, changes.value_type)
        with contextlib.suppress(InvalidArgument):
            whole = key_ordered(whole.keys, whole.values)
        yield from whole.rows()

    # --- transaction --------------------------------------------------------------------

    @property
    def has_committed(self) -> bool:
        return self._status is _State.COMMITTED

    @property
    def checkpoint_info(self) -> CheckpointInfo | None:
        """What :meth:`commit` returned, once committed."""
        return self._info

    def commit(self) -> CheckpointInfo:
        """Write ``<version+1>_<new id>.delta`` and make the new version current.

        Never overwrites a file; a concurrent attempt at the same version gets its own id. A
        store that changed nothing (after version 0) writes no file: its version keeps the
        parent's checkpoint id (``CheckpointInfo.has_file`` is False).
        On failure nothing becomes visible, the store is aborted and CannotCommit is raised
        (LocalDiskFull when local disk has no room for a large delta's file or its runs,
        LocalRunDamaged when a run file of the version is found damaged).
        """
        self._check_open()
        started = time.perf_counter()
        host, base = self._host, self._version
        ref = CheckpointRef(base.ref.version + 1, new_checkpoint_id())
        assert ref.checkpoint_id is not None
        lineage = host.lineage_for_child(base)
        try:
            changes = self._changes()
            rows = base.rows + self._looked_up.row_change(base, changes)
            if not len(changes) and base.ref.version >= 1:
                # Nothing changed: the version keeps its parent's id and writes no file.
                info = record_unchanged(host.checkpoints, base.ref, lineage, rows)
            else:
                info = write_delta(
                    host.checkpoints,
                    ref,
                    lineage,
                    changes,
                    rows,
                    in_key_order=self._indexer.exact,
                )
        except (LocalDiskFull, LocalRunDamaged):
            # No local room for a large delta's file, or a run file of the version found
            # damaged while counting rows: nothing went to storage.
            self._status = _State.ABORTED
            raise
        except (
            pa.ArrowException,
            TypeError,
            ValueError,
            OverflowError,
            StorageError,
            OSError,  # writing a large delta's local file
        ) as e:
            self._status = _State.ABORTED
            raise CannotCommit(
                f"commit failed, nothing was made visible: {e}",
                store=self.store_id,
                version=ref.version,
                checkpoint_id=ref.checkpoint_id,
                path=self.store_id.file_path(ref.version, ref.checkpoint_id, FileKind.DELTA),
            ) from e
        try:
            self._version = base.derive(changes, info.ref, lineage, rows)
        except (LocalDiskFull, LocalRunDamaged):
            # The delta is written but never reported: a retry commits under a new id.
            self._status = _State.ABORTED
            raise
        host.install(self._version)
        self._pending.clear()
        self._status = _State.COMMITTED
        elapsed = (time.perf_counter() - started) * 1000
        removed = changes.removals
        self.metrics.rows = rows
        self.metrics.updated_keys = len(changes) - removed
        self.metrics.removed_keys = removed
        self.metrics.bytes_written = info.bytes_written
        self.metrics.commit_ms = elapsed
        self.metrics.disk = disk_metrics(self._version.runs, self._disk_at_open)
        self._info = dataclasses.replace(
            info, timings_ms={"load": self.metrics.load.load_ms, "commit": elapsed}
        )
        return self._info

    def abort(self) -> None:
        """Discard this version's updates; no file is written. Idempotent after commit/abort."""
        self._looked_up.drop()  # also after a failed commit (aborted already)
        if self._status is _State.OPEN:
            self._puts = _Changes()
            self._pending.clear()
            self._status = _State.ABORTED
