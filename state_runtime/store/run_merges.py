"""Merging runs that may be on local disk: block by block, streamed into a new run file.

A merge of two runs in memory stays in memory (spilled if the result outgrows the threshold);
a merge with a run on disk reads both a block at a time (:func:`merge_blocks`) and writes the
result to a new file (counted as compaction bytes), so memory holds a few blocks whatever
the runs' size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from state_runtime.store.disk_runs import AnyRun, DiskRun, held_bytes, spilled, written
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.sorted_runs import Run


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


def merge(
    indexer: KeyIndexer, older: AnyRun, newer: AnyRun, *, drop_removals: bool, store: object | None
) -> AnyRun:
    """``older`` overlaid by ``newer``: in memory if both are, else streamed to disk; over
    an empty ``older``, ``newer`` itself when it has no removal to drop (a store's first
    version on disk is not written twice)."""
    if not len(older) and not (drop_removals and newer.removals):
        return spilled(store, newer) if isinstance(newer, Run) else newer
    if isinstance(older, Run) and isinstance(newer, Run):
        return spilled(store, older.merged_with(indexer, newer, drop_removals=drop_removals))
    pieces = merge_blocks(indexer, older.blocks(), newer.blocks(), drop_removals=drop_removals)
    first = older if isinstance(older, DiskRun) else newer
    assert isinstance(first, DiskRun)
    needed = held_bytes(older) + held_bytes(newer)
    return written(first.store, pieces, first.key_type, first.value_type, needed, compaction=True)
