"""Streaming deduplication: Spark's ``dropDuplicates(columns)`` and
``dropDuplicatesWithinWatermark(columns)`` on a query with a watermark.

As Spark's ``StreamingDeduplicateExec``: input rows at or before the previous batch's
watermark are dropped as late (rows with a null event time are kept); a row whose key (the
``columns``) is not in the state is emitted and its key stored, later rows of that key are
dropped (within a batch, the first row of each key in the partition's input is the one kept).
Eviction, after the batch's rows, with the batch's own watermark:

- ``dropDuplicates``: a key is removed once the watermark reaches the event-time column among
  the key columns (``time <= watermark``); without that column among them, never (as Spark).
- ``dropDuplicatesWithinWatermark``: each key stores ``expires_at = event time + delay`` (in
  microseconds; a null time counts as 0, as Spark reads it) and is removed once the watermark
  reaches it (``expires_at <= watermark``).

Found in one vectorised lookup of the batch's first rows per key, stored with one bulk update;
eviction is one bulk removal per partition.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.context import current_batch
from state_runtime.runtime.operator import ColumnUse, StatefulOperator
from state_runtime.runtime.times import MICROS_PER_MS, event_micros, null_times
from state_runtime.runtime.watermark import Watermark
from state_runtime.store.config import StoreConfig
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

EXPIRES_AT = "expires_at"
_ROW = "__dedup_row"


@dataclass(frozen=True)
class _Deduplicate:
    columns: tuple[str, ...]
    event_time_column: str
    delay_micros: int | None
    """Set for ``within_watermark``: a key expires ``delay`` after its first row's time."""

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        batch = current_batch()
        output = self._first_of_new_keys(store, rows) if rows.num_rows else None
        if batch.watermark_ms is not None:
            self._evict(store, batch.watermark_ms * MICROS_PER_MS)
        return output

    def _first_of_new_keys(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        numbered = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows)))
        first = numbered.group_by(list(self.columns), use_threads=False).aggregate([(_ROW, "min")])
        key_type = store.schema.key_arrow
        keys = pa.StructArray.from_arrays(
            [
                first.column(c).combine_chunks().cast(key_type.field(i).type)
                for i, c in enumerate(self.columns)
            ],
            fields=list(key_type),
        )
        new = pc.is_null(store.lookup(keys))
        if not pc.any(new).as_py():
            return None
        firsts = pc.filter(first.column(f"{_ROW}_min"), new).combine_chunks()
        order = pc.sort_indices(firsts)  # the output keeps the input's order
        keys = keys.filter(new).take(order)
        taken = rows.take(firsts.take(order))
        expires = pa.nulls(len(keys), pa.int64())
        if self.delay_micros is not None:
            micros = event_micros(taken.column(self.event_time_column), self.event_time_column)
            expires = pa.array(np.where(null_times(micros), 0, micros) + self.delay_micros)
        values = pa.StructArray.from_arrays([expires], fields=list(store.schema.value_arrow))
        store.apply_arrow(pa.table({"key": keys, "value": values}))
        return taken

    def _evict(self, store: StateStore, watermark_micros: int) -> None:
        started = time.perf_counter()
        if self.delay_micros is not None:
            removed = store.remove_matching(
                lambda _keys, values: pc.less_equal(
                    pc.struct_field(values, EXPIRES_AT), watermark_micros
                )
            )
        elif self.event_time_column in self.columns:
            field = self.columns.index(self.event_time_column)
            removed = store.remove_matching(
                lambda keys, _values: pc.less_equal(
                    pc.struct_field(keys, field).cast(pa.int64()), watermark_micros
                )
            )
        else:
            return
        stats = current_batch().event_time
        stats.evicted += removed.num_rows
        stats.evict_ms += (time.perf_counter() - started) * 1000


def drop_duplicates(
    operator_id: int,
    columns: Sequence[str],
    input_schema: str | StructType,
    watermark: Watermark,
    num_partitions: int,
    *,
    within_watermark: bool = False,
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
) -> StatefulOperator:
    """Spark's ``dropDuplicates(columns)`` (``within_watermark=True``:
    ``dropDuplicatesWithinWatermark(columns)``) on input of ``input_schema``, in a query whose
    watermark is ``watermark``. The output is the input's rows that pass, with its columns."""
    schema = parse_schema(input_schema)
    missing = [c for c in columns if c not in schema.names]
    if missing or not columns:
        raise InvalidArgument(
            f"drop_duplicates: columns {list(columns)} must be a non-empty subset of the input "
            f"<{schema.simpleString()}>"
        )
    key = StructType([schema[c] for c in columns])
    delay = watermark.delay_ms * MICROS_PER_MS if within_watermark else None
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(columns),
        key_schema=key,
        value_schema=f"{EXPIRES_AT} bigint",
        output_schema=schema,
        update=_Deduplicate(tuple(columns), watermark.column, delay),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
        late_column=watermark.column,
        uses_event_time=True,
        kind="dropDuplicatesWithinWatermark" if within_watermark else "dropDuplicates",
        passes_on="rows",
        reads=(ColumnUse(watermark.column, "event-time column", "timestamp"),),
    )
