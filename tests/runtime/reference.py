"""Plain-Python reference computations and lineage checks for the runtime tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from state_runtime.catalog import Catalog
from state_runtime.identity import FileKind
from state_runtime.storage import Storage
from state_runtime.store.provider import StateStoreProvider


def running_totals(events: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """user -> (count, sum of amounts): what a running count/sum aggregation must hold."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for user, amount in events:
        totals[user][0] += 1
        totals[user][1] += amount
    return {u: (c, s) for u, (c, s) in totals.items()}


def assert_lineage_linear(catalog: Catalog, storage: Storage) -> int:
    """Every store's committed versions form one chain: each committed delta's parent is the
    previously committed checkpoint, and every committed version is loadable. Returns the
    number of commits checked."""
    root = storage.uri
    checked = 0
    for record in catalog.stores(root):
        store = record.key.store
        history = sorted(
            catalog.commit_history(root, store=store, limit=100_000), key=lambda e: e.ref.version
        )
        provider = StateStoreProvider(
            storage,
            store.operator_id,
            store.partition_id,
            store.store_name,
            key_schema=record.key_schema,
            value_schema=record.value_schema,
        )
        versions = [e.ref.version for e in history]
        assert versions == list(range(1, len(history) + 1)), (store, versions)
        previous = None
        for entry in history:
            if previous is not None and entry.ref.checkpoint_id == previous.checkpoint_id:
                # changed nothing: no file, the parent's id (docs/checkpoint-format.md)
                assert provider.unchanged(entry.ref), (store, entry.ref)
            else:
                header = provider.read_header(entry.ref, FileKind.DELTA)
                parent = header.lineage[0] if header.lineage else None
                assert parent is not None or previous is None, (store, entry.ref)
                assert parent is None or parent.checkpoint_id == previous.checkpoint_id, (
                    store,
                    entry.ref,
                    parent,
                    previous,
                )
            previous = entry.ref
            checked += 1
        if history:
            provider.get_read_store(history[-1].ref.version, history[-1].ref.checkpoint_id)
    return checked


# --- event time: Spark's documented semantics, one row at a time ---------------------------


def window_starts(t_us: int, size_us: int, slide_us: int, offset_us: int = 0) -> list[int]:
    """The starts of the windows ``[offset + k * slide, ... + size)`` that contain ``t``."""
    first_k = (t_us - size_us - offset_us) // slide_us
    last_k = (t_us - offset_us) // slide_us
    starts = [offset_us + k * slide_us for k in range(first_k, last_k + 1)]
    return [s for s in starts if s <= t_us < s + size_us]


class WatermarkReference:
    """The watermark of batch ``b``: max(previous, max event time of batches < b - delay);
    0 before any data. ``previous_ms`` is batch ``b - 1``'s: since Spark 3.4 it judges late
    rows, the batch's own evicts state. Event times are microseconds, watermarks ms."""

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.current_ms = 0
        self.previous_ms = 0

    def after_batch(self, event_times_us: Iterable[int]) -> None:
        times = list(event_times_us)
        self.previous_ms = self.current_ms
        if times:
            self.current_ms = max(self.current_ms, max(times) // 1000 - self.delay_ms)


class WindowedCountReference:
    """``groupBy(key, window(ts, size, slide)).agg(count, sum(amount))`` with a watermark,
    in Spark's update or append output mode. ``run_batch`` returns the batch's output
    {(key, window start us): (count, sum)} and how many (row, window) pairs were late.
    Checked against Spark 4's own streaming aggregation (file source, one file per batch,
    no-data batches off): the same output in every batch, in both modes."""

    def __init__(self, size_us: int, slide_us: int, delay_ms: int, mode: str) -> None:
        self.size_us, self.slide_us, self.mode = size_us, slide_us, mode
        self.watermark = WatermarkReference(delay_ms)
        self.state: dict[tuple[str, int], tuple[int, int]] = {}

    def run_batch(
        self, events: list[tuple[str, int, int]]
    ) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
        bound_us = self.watermark.current_ms * 1000
        late_bound_us = self.watermark.previous_ms * 1000
        late, updated = 0, set()
        for key, t_us, amount in events:
            for start in window_starts(t_us, self.size_us, self.slide_us):
                if start + self.size_us <= late_bound_us:
                    late += 1
                    continue
                n, total = self.state.get((key, start), (0, 0))
                self.state[(key, start)] = (n + 1, total + amount)
                updated.add((key, start))
        emitted = {w: self.state[w] for w in updated}  # update mode: before eviction
        closed = [w for w in self.state if w[1] + self.size_us <= bound_us]
        evicted = {w: self.state.pop(w) for w in closed}
        self.watermark.after_batch(t for _, t, _ in events)
        return (emitted if self.mode == "update" else evicted), late


class SessionTimeoutReference:
    """Per key: count rows, time out ``gap_ms`` after the key's latest event time; the
    timeout fires (once) when the watermark passes it, emitting the final count. Rows at or
    before the previous batch's watermark are dropped. Output per batch: {(key, count,
    closed)}."""

    def __init__(self, gap_ms: int, delay_ms: int) -> None:
        self.gap_ms = gap_ms
        self.watermark = WatermarkReference(delay_ms)
        self.state: dict[str, tuple[int, int]] = {}  # key -> (count, timeout ms)

    def run_batch(self, events: list[tuple[str, int]]) -> tuple[set[tuple[str, int, bool]], int]:
        wm = self.watermark.current_ms
        kept = [(k, t) for k, t in events if t > self.watermark.previous_ms * 1000]
        out: set[tuple[str, int, bool]] = set()
        by_key: dict[str, list[int]] = defaultdict(list)
        for k, t in kept:
            by_key[k].append(t)
        for k, times in by_key.items():
            n, timeout = self.state.get(k, (0, 0))
            n += len(times)
            timeout = max(timeout - self.gap_ms, max(times) // 1000) + self.gap_ms
            self.state[k] = (n, timeout)
            out.add((k, n, False))
        for k in [k for k, (_, timeout) in self.state.items() if k not in by_key and timeout < wm]:
            out.add((k, self.state.pop(k)[0], True))
        self.watermark.after_batch(t for _, t in events)
        return out, len(events) - len(kept)
