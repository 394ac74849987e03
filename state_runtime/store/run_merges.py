"""Merging runs that may be on local disk, and when to: the compaction policy.

A merge of two runs in memory stays in memory (spilled if the result outgrows the threshold).
With a run on disk, only the parts whose index ranges overlap a part of the other side are
merged: read a block at a time (:func:`merge_blocks`) and written to a new file (counted as
compaction bytes), so memory holds a few blocks whatever the runs' size. Parts that overlap
nothing on the other side hold no key in common with it and are kept as they are, side by
side in a :class:`~state_runtime.store.run_levels.RunLevel`: nothing written. A run goes onto
the one below it (:func:`due`) when their ranges do not overlap, or once it holds at least half
the rows of the parts below that it overlaps (docs/state-on-disk.md, "Write amplification").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, pairwise

import numpy as np
import pyarrow as pa

from state_runtime.store.disk_runs import LOCAL_DISK, DiskRun, Part
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_levels import (
    AnyRun,
    RunLevel,
    held_bytes,
    memory_held,
    parts,
    span,
    spilled,
)
from state_runtime.store.run_writer import spill_run, written
from state_runtime.store.sorted_runs import Run, concat

MAX_PARTS = 64
"""Parts a level keeps at most (each on disk is an open file): past it, two adjacent parts are
rewritten as one (:func:`level`)."""


def merge_blocks(
    indexer: KeyIndexer,
    older: Iterable[Run],
    newer: Iterable[Run],
    *,
    drop_removals: bool,
) -> Iterator[Run]:
    """``older`` overlaid by ``newer`` (both blocks in index order), in pieces in index order.

    Rows up to the smaller of the two current blocks' last index keys are complete on both
    sides (equal index keys never straddle blocks), so they merge; the rest waits.
    """
    olds, news = iter(older), iter(newer)
    old, new = next(olds, None), next(news, None)
    empty: Run | None = None
    while old is not None or new is not None:
        if old is not None and not len(old):
            old = next(olds, None)
            continue
        if new is not None and not len(new):
            new = next(news, None)
            continue
        if old is None or new is None:
            rest = old if old is not None else new
            assert rest is not None
            if empty is None:
                empty = Run.empty(rest.keys.type, rest.values.type)
            if old is not None:
                yield rest.merged_with(indexer, empty, drop_removals=drop_removals)
                old = next(olds, None)
            else:
                yield empty.merged_with(indexer, rest, drop_removals=drop_removals)
                new = next(news, None)
            continue
        t = min(old.index[-1], new.index[-1])
        o = int(np.searchsorted(old.index, t, side="right"))
        n = int(np.searchsorted(new.index, t, side="right"))
        yield old.slice(0, o).merged_with(indexer, new.slice(0, n), drop_removals=drop_removals)
        old = old.slice(o, len(old)) if o < len(old) else next(olds, None)
        new = new.slice(n, len(new)) if n < len(new) else next(news, None)


def overlapped_rows(older: AnyRun, newer: AnyRun) -> int:
    """Rows of ``older``'s parts whose index range overlaps one of ``newer``'s parts (a
    part of ``older`` in a gap between ``newer``'s parts is not counted)."""
    spans = np.array([span(p) for p in parts(newer)], dtype=np.int64).reshape(-1, 2)
    rows = 0
    for p in parts(older):
        first, last = span(p)
        # The first part of ``newer`` that ends at or after ``first``: it overlaps ``p`` if
        # it starts at or before ``last`` (``newer``'s parts are in index order, disjoint).
        n = int(np.searchsorted(spans[:, 1], first, side="left"))
        rows += len(p) if n < len(spans) and spans[n, 0] <= last else 0
    return rows


def due(older: AnyRun, newer: AnyRun) -> bool:
    """Whether ``newer`` (just above ``older``) goes onto it now: it holds at least half the
    rows of the parts of ``older`` it overlaps (none: a level, nothing written). Two runs in
    memory merge in memory whatever their ranges: at least half the older's rows."""
    if isinstance(older, Run) and isinstance(newer, Run):
        return 2 * len(newer) >= len(older)
    return 2 * len(newer) >= overlapped_rows(older, newer)


def merge(
    indexer: KeyIndexer, older: AnyRun, newer: AnyRun, *, drop_removals: bool, store: object | None
) -> AnyRun:
    """``older`` overlaid by ``newer`` (see the module); over an empty ``older``, ``newer``
    itself when it has no removal to drop (a store's first version on disk is not written
    twice)."""
    if not len(older) and not (drop_removals and newer.removals):
        return spilled(store, newer)
    if isinstance(older, Run) and isinstance(newer, Run):
        return spilled(store, older.merged_with(indexer, newer, drop_removals=drop_removals))
    owner = next(p.store for p in (*parts(older), *parts(newer)) if isinstance(p, DiskRun))
    types = older.key_type, older.value_type
    kept: list[Part] = []
    for olds, news in _overlapping(parts(older), parts(newer)):
        removals = drop_removals and any(p.removals for p in (*olds, *news))
        if (olds and news) or removals:
            kept.append(_merged(indexer, olds, news, drop_removals, owner, types))
        else:
            kept.extend(olds or news)
    return level(kept, owner, types)


def _overlapping(
    older: Sequence[Part], newer: Sequence[Part]
) -> list[tuple[list[Part], list[Part]]]:
    """The parts of both sides in groups whose index ranges chain into one, in index order:
    each group's parts of ``older``, then of ``newer``, in index order."""
    tagged = sorted(
        [(span(p), False, p) for p in older] + [(span(p), True, p) for p in newer],
        key=lambda t: t[0][0],
    )
    groups: list[tuple[list[Part], list[Part]]] = []
    end: int | None = None
    for (first, last), is_new, part in tagged:
        if end is None or first > end:
            groups.append(([], []))
            end = last
        end = max(end, last)
        groups[-1][1 if is_new else 0].append(part)
    return groups


def _merged(
    indexer: KeyIndexer,
    olds: list[Part],
    news: list[Part],
    drop_removals: bool,
    store: object,
    types: tuple[pa.DataType, pa.DataType],
) -> Part:
    """``olds`` overlaid by ``news`` as one part: in memory if all are, else streamed to disk."""
    if all(isinstance(p, Run) for p in (*olds, *news)):
        old = concat([p for p in olds if isinstance(p, Run)], *types)
        new = concat([p for p in news if isinstance(p, Run)], *types)
        return spill_run(store, old.merged_with(indexer, new, drop_removals=drop_removals))
    pieces = merge_blocks(
        indexer,
        chain.from_iterable(p.blocks() for p in olds),
        chain.from_iterable(p.blocks() for p in news),
        drop_removals=drop_removals,
    )
    needed = sum(held_bytes(p) for p in (*olds, *news))
    return written(store, pieces, *types, needed, compaction=True)


def level(kept: list[Part], store: object, types: tuple[pa.DataType, pa.DataType]) -> AnyRun:
    """Parts in index order whose ranges do not overlap as one run: adjacent parts in memory
    concatenated, the largest in memory spilled until those left hold at most the threshold
    together (:func:`memory_held`), one part as itself, at most :data:`MAX_PARTS`
    parts (K > MAX_PARTS equal parts arriving in key order: at most 1 + log2(K / MAX_PARTS)
    rewrites a row on average, docs/state-on-disk.md)."""
    joined: list[Part] = []
    for part in kept:
        if not len(part):
            continue
        if joined and isinstance(part, Run) and isinstance(joined[-1], Run):
            joined[-1] = concat([joined[-1], part], *types)
        else:
            joined.append(part)
    while memory_held(joined) > LOCAL_DISK.threshold():
        i = max(
            (i for i, p in enumerate(joined) if isinstance(p, Run)), key=lambda i: joined[i].nbytes
        )
        run = joined[i]
        assert isinstance(run, Run)
        joined[i] = written(store, [run], *types, run.nbytes, compaction=False)
    while len(joined) > MAX_PARTS:
        sizes = [len(p) for p in joined]
        # Two parts within twice each other's rows (a row's part grows 1.5 times or more
        # each time it is rewritten), the fewest rows together; else the fewest of all.
        costs = [(max(a, b) > 2 * min(a, b), a + b) for a, b in pairwise(sizes)]
        i = costs.index(min(costs))
        pair = joined[i : i + 2]
        pieces = chain.from_iterable(p.blocks() for p in pair)
        needed = sum(held_bytes(p) for p in pair)
        joined[i : i + 2] = [written(store, pieces, *types, needed, compaction=True)]
    if not joined:
        return Run.empty(*types)
    return joined[0] if len(joined) == 1 else RunLevel(joined)
