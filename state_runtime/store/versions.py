"""Committed versions in memory: immutable stacks of sorted runs that share structure.

A :class:`Version` is a base run (the state at some earlier point, no removals) under a few
change runs, newest first. Version ``v + 1`` is version ``v`` with one more change run on top:
it shares every run of ``v`` and costs O(changes). Runs of similar size are merged (as in a
log-structured merge tree) so lookups pass few runs, and once the changes add up to a quarter
of the base they are folded into a new base, so the work per change stays bounded. Nothing is
ever modified in place: a reader of version ``v`` sees exactly ``v``, in any thread, whatever
is committed meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from state_runtime.identity import CheckpointRef
from state_runtime.store.arrow_rows import Row, to_python
from state_runtime.store.checkpoint_format import BATCH_BYTES
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import INT64_MIN, KeyIndexer, freeze
from state_runtime.store.run_levels import AnyRun, spilled
from state_runtime.store.run_merges import due, merge, merge_blocks
from state_runtime.store.sorted_runs import Run, concat, run_of

COMPACT_FRACTION = 4
"""Fold the change runs into the base once they hold 1/COMPACT_FRACTION of its rows."""


def get(indexer: KeyIndexer, runs: Sequence[AnyRun], key: Row) -> Row | None:
    """The value of one normalised key tuple in a stack of runs (newest first), or None."""
    h = indexer.index_of(key)
    for run in runs:
        i = run.position_of(indexer, h, key)
        if i >= 0:
            return run.value_at(i)
    return None


def lookup(
    indexer: KeyIndexer, runs: Sequence[AnyRun], keys: pa.StructArray, value_type: pa.DataType
) -> pa.StructArray:
    """The values of ``keys`` in a stack of runs (newest first); null where absent."""
    index = indexer.index(keys)
    n = len(index)
    todo = np.arange(n)
    parts: list[pa.Array] = []
    order: list[np.ndarray] = []
    for run in runs:
        if not len(todo):
            break
        pos, values = run.find(indexer, index[todo], keys, todo)
        hit = pos >= 0
        if len(values):
            parts.append(values)
            order.append(todo[hit])
        todo = todo[~hit]
    if len(todo):
        parts.append(pa.nulls(len(todo), type=value_type))
        order.append(todo)
    if not parts:
        return pa.array([], type=value_type)
    if len(parts) == 1 and bool(np.all(order[0] == np.arange(n))):
        return parts[0]
    inverse = np.empty(n, dtype=np.int64)
    inverse[np.concatenate(order)] = np.arange(n)
    return pa.concat_arrays(parts).take(pa.array(inverse))


def squash(
    indexer: KeyIndexer,
    runs: Sequence[AnyRun],
    store: object | None = None,
    *,
    over_nothing: bool = False,
) -> AnyRun:
    """Change runs (newest first) as one change run; the newest change of each key wins.

    Two runs merge in O(rows); more in memory are concatenated and sorted once
    (O(rows log rows)); with runs on disk they merge pairwise, the two neighbours of fewest rows
    between them first (overlaying is associative, so any order of neighbours gives the same
    run): a large first delta under small later ones is rewritten once, not once per delta.
    ``over_nothing``: no rows lie below the runs, so their last pairwise merge drops removals
    (the version over an empty base then does not write the run again on disk to drop them).
    It has no effect on a single run, nor on more than two runs all in memory (sorted together
    once): those keep their removals.
    """
    if len(runs) > 2 and not any(run.on_disk for run in runs):
        oldest_first = [run for run in reversed(runs) if isinstance(run, Run)]
        squashed, _ = Run.build(
            indexer,
            pa.concat_arrays([r.keys for r in oldest_first]),
            pa.concat_arrays([r.values for r in oldest_first]),
        )
        return squashed
    left = list(runs)
    while len(left) > 1:
        i = min(range(len(left) - 1), key=lambda j: len(left[j]) + len(left[j + 1]))
        drop = over_nothing and len(left) == 2
        left[i : i + 2] = [merge(indexer, left[i + 1], left[i], drop_removals=drop, store=store)]
    return left[0]


def live_blocks(
    indexer: KeyIndexer, runs: Sequence[AnyRun], store: object | None = None
) -> Iterator[Run]:
    """The rows of a stack of runs (newest first, the base last, without removals) that are
    not removed, in index order: one run when all are in memory, else block by block."""
    yield from layer_blocks(indexer, *layers(indexer, runs, store))


def layers(
    indexer: KeyIndexer, runs: Sequence[AnyRun], store: object | None = None
) -> tuple[AnyRun, AnyRun | None]:
    """A stack of runs (newest first) as its base and its changes squashed into one run
    (None: no changes), for :func:`layer_blocks` to read, as often as needed."""
    base, overlays = runs[-1], runs[:-1]
    return base, squash(indexer, overlays, store) if overlays else None


def layer_blocks(indexer: KeyIndexer, base: AnyRun, changes: AnyRun | None) -> Iterator[Run]:
    """The live rows of ``base`` under ``changes`` in index order (see :func:`live_blocks`)."""
    if changes is None:
        yield from base.blocks()
    elif isinstance(base, Run) and isinstance(changes, Run):
        yield base.merged_with(indexer, changes, drop_removals=True)
    else:
        yield from merge_blocks(indexer, base.blocks(), changes.blocks(), drop_removals=True)


def row_change(indexer: KeyIndexer, runs: Sequence[AnyRun], changes: AnyRun) -> int:
    """Rows that ``changes`` adds (positive) or removes (negative) on top of ``runs``: looked
    up a piece of about :data:`BATCH_BYTES` at a time, so that a large change run costs a
    piece's lookup in memory, not its own size again."""
    change = 0
    for block in changes.blocks():
        for piece in block.pieces(BATCH_BYTES):
            before = lookup(indexer, runs, piece.keys, piece.values.type)
            existed, puts = _valid(before), _valid(piece.values)
            change += int(np.count_nonzero(puts & ~existed) - np.count_nonzero(~puts & existed))
    return change


def counted_union(
    indexer: KeyIndexer, runs: Sequence[AnyRun], changes: Sequence[Run], *, squash: bool
) -> tuple[np.ndarray, Run | None]:
    """:func:`row_change` of each of ``changes`` (oldest first, in memory, each holding a key
    at most once) on top of ``runs`` and the changes before it, from one sorted union of
    their rows: a key's first change is looked up in ``runs`` (one lookup for all), each later
    one follows the change before it. A few array operations, O(rows log rows), whatever the
    number of changes, where :func:`row_change` on each in turn would look each one up in
    every older one (n²/2 lookups for a chain of n). With ``squash``, also the changes
    squashed into one run from the same sorted union (the newest change of each key), as
    :func:`squash` of more than two runs in memory builds it by sorting them again; None
    without ``squash``, without rows, or when different keys share an index key (their order
    in the union is not a run's)."""
    sizes = [len(c) for c in changes]
    if not sum(sizes):
        return np.zeros(len(changes), dtype=np.int64), None
    index = np.concatenate([c.index for c in changes])
    order = np.argsort(index, kind="stable")  # a key's changes stay oldest first
    keys = pa.concat_arrays([c.keys for c in changes]).take(pa.array(order))
    order, keys, after, regrouped = _grouped(indexer, index[order], keys, order)
    puts = np.concatenate([_valid(c.values) for c in changes])[order]
    existed = np.empty(len(order), dtype=bool)
    later = np.flatnonzero(after)
    existed[later] = puts[later - 1]
    firsts = keys.filter(pa.array(~after)) if len(later) else keys
    existed[~after] = _valid(lookup(indexer, runs, firsts, changes[0].value_type))
    source = np.repeat(np.arange(len(changes)), sizes)[order]
    added = np.bincount(source[puts & ~existed], minlength=len(changes))
    removed = np.bincount(source[~puts & existed], minlength=len(changes))
    counts = (added - removed).astype(np.int64)
    if not squash or regrouped:
        return counts, None
    last = np.ones(len(order), dtype=bool)  # the newest change of each key: the next is not it
    last[:-1] = ~after[1:]
    values = pa.concat_arrays([c.values for c in changes]).take(pa.array(order))
    mask = pa.array(last)
    return counts, run_of(index[order][last], keys.filter(mask), values.filter(mask))


def _grouped(
    indexer: KeyIndexer, index: np.ndarray, keys: pa.StructArray, order: np.ndarray
) -> tuple[np.ndarray, pa.StructArray, np.ndarray, bool]:
    """Rows sorted by index key (stable; ``keys`` theirs, ``order`` where each came from)
    with equal keys made adjacent, a mask of the rows whose key is the row's before, and
    whether rows were reordered: only different keys that share an index key (rare) are,
    by key, stably."""
    after = np.zeros(len(index), dtype=bool)
    pairs = np.flatnonzero(index[1:] == index[:-1])
    if not len(pairs):
        return order, keys, after, False
    same = np.ones(len(pairs), dtype=bool)
    # One integer key column: equal index means equal key, except null against INT64_MIN.
    check = np.flatnonzero(index[pairs] == INT64_MIN) if indexer.exact else np.arange(len(pairs))
    if len(check):
        left, right = pa.array(pairs[check]), pa.array(pairs[check] + 1)
        same[check] = indexer.same(keys.take(left), keys.take(right))
    after[pairs + 1] = same
    if bool(same.all()):
        return order, keys, after, False
    perm = np.arange(len(index))
    for start in np.unique(index[pairs[~same]]):
        lo = int(np.searchsorted(index, start, side="left"))
        hi = int(np.searchsorted(index, start, side="right"))
        columns = [to_python(c) for c in keys.slice(lo, hi - lo).flatten()]
        first_seen: dict[object, int] = {}
        rank = np.array(
            [
                first_seen.setdefault(freeze(row), len(first_seen))
                for row in zip(*columns, strict=True)
            ]
        )
        regroup = np.argsort(rank, kind="stable")
        perm[lo:hi] = lo + regroup
        after[lo + 1 : hi] = rank[regroup][1:] == rank[regroup][:-1]
    return order[perm], keys.take(pa.array(perm)), after, True


def _valid(values: pa.Array) -> np.ndarray:
    """Where ``values`` is not null (a put, not a removal), as a numpy mask."""
    return np.asarray(values.is_valid().to_numpy(zero_copy_only=False))


MEMO_FRACTION = 8
"""A writable store's :class:`LookupMemo` holds at most 1/MEMO_FRACTION of the budget."""


class LookupMemo:
    """What a writable store's batch lookups found in its version (absent keys as removals),
    as runs to put above the version's own: its commit counts the rows its changes add or
    remove by looking them up (:func:`row_change`), and the keys it looked up before (a
    read-modify-write batch: all of them) are answered here instead of by the version's runs
    again, which on disk means reading their blocks a second time. At most
    1/:data:`MEMO_FRACTION` of the memory budget (a lookup past it is not remembered: its
    keys are looked up in the version again, same count), and only until the commit has
    counted its rows or the store is aborted (:meth:`drop`)."""

    def __init__(self, indexer: KeyIndexer) -> None:
        self._indexer = indexer
        self.runs: list[Run] = []
        self.nbytes = 0
        self._open = True

    def add(self, keys: pa.StructArray, values: pa.StructArray) -> None:
        """Remember that the version holds ``values`` (null: absent) for ``keys``, if the
        memo is still open and they fit its cap."""
        cap = LOCAL_DISK.budget() // MEMO_FRACTION
        if not self._open or self.nbytes + keys.nbytes + values.nbytes > cap:
            return  # not even the columns fit: skip building their run
        run, _ = Run.build(self._indexer, keys, values)
        if self.nbytes + run.nbytes <= cap:
            self.runs.append(run)
            self.nbytes += run.nbytes

    def row_change(self, version: Version, changes: AnyRun) -> int:
        """:func:`row_change` of ``changes`` on ``version`` (the version looked up), answered
        here first; the memo is dropped afterwards, as nothing asks it again."""
        try:
            return row_change(self._indexer, (*self.runs, *version.runs), changes)
        finally:
            self.drop()

    def drop(self) -> None:
        """Forget every answer and remember no more (the store committed or aborted)."""
        self.runs, self.nbytes, self._open = [], 0, False


@dataclass(frozen=True, eq=False)
class Version:
    """One committed version: ``base`` under ``overlays`` (change runs, newest first)."""

    indexer: KeyIndexer
    ref: CheckpointRef
    lineage: tuple[CheckpointRef, ...]
    rows: int
    base: AnyRun
    overlays: tuple[AnyRun, ...] = ()
    store: object | None = None
    """The store whose large runs go to local disk (None: every run stays in memory)."""

    @classmethod
    def of(
        cls,
        indexer: KeyIndexer,
        base: AnyRun,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        store: object | None = None,
    ) -> Version:
        """A version whose whole state is ``base`` (a snapshot, or empty)."""
        return cls(indexer, ref, lineage, len(base), spilled(store, base), (), store)

    runs: tuple[AnyRun, ...] = field(init=False)
    """Newest first, the base last."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", (*self.overlays, self.base))

    @property
    def nbytes(self) -> int:
        return sum(run.nbytes for run in self.runs)

    def get(self, key: Row) -> Row | None:
        return get(self.indexer, self.runs, key)

    def lookup(self, keys: pa.StructArray) -> pa.StructArray:
        return lookup(self.indexer, self.runs, keys, self.base.value_type)

    def blocks(self) -> Iterator[Run]:
        """Every row of this version in index order, block by block (see :func:`live_blocks`)."""
        return live_blocks(self.indexer, self.runs, self.store)

    def layers(self) -> tuple[AnyRun, AnyRun | None]:
        """The base and the changes squashed into one run (see :func:`layers`)."""
        return layers(self.indexer, self.runs, self.store)

    def state(self) -> Run:
        """Every row of this version as one run in memory (O(rows) when layered)."""
        return concat(list(self.blocks()), self.base.key_type, self.base.value_type)

    def items(self) -> Iterator[tuple[Row, Row]]:
        for block in self.blocks():
            for key, value in block.rows():
                assert value is not None
                yield key, value

    def derive(
        self,
        changes: AnyRun,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        rows: int,
    ) -> Version:
        """This version plus ``changes`` (a change run), as version ``ref`` with ``rows`` rows."""
        overlays: list[AnyRun] = list(self.overlays)
        if len(changes):
            overlays.insert(0, spilled(self.store, changes))
        while len(overlays) >= 2 and due(overlays[1], overlays[0]):
            overlays[0:2] = [
                merge(self.indexer, overlays[1], overlays[0], drop_removals=False, store=self.store)
            ]
        base = self.base
        if overlays and COMPACT_FRACTION * sum(len(o) for o in overlays) >= len(base):
            changed = squash(self.indexer, overlays, self.store)
            base = merge(self.indexer, base, changed, drop_removals=True, store=self.store)
            overlays = []
        else:
            base = spilled(self.store, base)
        return Version(self.indexer, ref, lineage, rows, base, tuple(overlays), self.store)
