"""A writable store's changes before its commit, as change runs within the memory budget.

Each ``apply_arrow`` call (and each flush of per-key puts) adds a change run on top. The
runs in memory, and the parts in memory of levels, stay within the spill threshold (a quarter
of the budget, :meth:`~state_runtime.store.disk_runs.LocalDisk.threshold`): past it those on
top are squashed and the result goes to local disk, so a batch of many large calls holds
about one threshold of its changes in memory, whatever their total. Runs on disk whose
index ranges do not overlap are kept side by side as one level and never rewritten (a
running aggregation's chunks of whole keys, in key order); others merge like a binary
counter (the newer at least half the rows it overlaps), so a row is rewritten about
log2(changes / threshold) times and few runs stay on disk. In memory mode (a large budget)
nothing spills and the runs are squashed in memory, as before.
"""

from __future__ import annotations

from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.keys import KeyIndexer
from state_runtime.store.run_levels import AnyRun, memory_held
from state_runtime.store.run_merges import due, merge
from state_runtime.store.run_writer import written
from state_runtime.store.sorted_runs import Run
from state_runtime.store.versions import squash

MAX_RUNS_IN_MEMORY = 8
"""Squash the change runs in memory once there are more (lookups pass every run)."""


class ChangeRuns:
    """The change runs of one store's version being built: newest first, those in memory
    above those on disk."""

    def __init__(self, indexer: KeyIndexer, store: object) -> None:
        self._indexer = indexer
        self._store = store
        self.runs: list[AnyRun] = []

    def __bool__(self) -> bool:
        return bool(self.runs)

    def _in_memory(self) -> list[AnyRun]:
        return [r for r in self.runs if isinstance(r, Run)]

    def push(self, run: Run) -> None:
        """Put ``run`` on top (see the module)."""
        self.runs.insert(0, run)
        in_memory = self._in_memory()
        if memory_held(self.runs) > LOCAL_DISK.threshold():
            top = squash(self._indexer, in_memory)
            assert isinstance(top, Run)
            types = top.keys.type, top.values.type
            on_disk = written(self._store, [top], *types, top.nbytes, compaction=False)
            self.runs = self._binary_merged([on_disk, *self.runs[len(in_memory) :]])
        elif len(in_memory) > MAX_RUNS_IN_MEMORY:
            self.runs[: len(in_memory)] = [squash(self._indexer, in_memory)]

    def _binary_merged(self, runs: list[AnyRun]) -> list[AnyRun]:
        """``runs`` (newest first), each put onto the older one below it while it is
        :func:`~state_runtime.store.run_merges.due`: at once when their ranges do not
        overlap (nothing written), else once it holds at least half the rows it overlaps."""
        while len(runs) >= 2 and due(runs[1], runs[0]):
            older, newer = runs[1], runs[0]
            runs[0:2] = [merge(self._indexer, older, newer, drop_removals=False, store=self._store)]
        return runs

    def squashed(self) -> AnyRun:
        """The change runs as one, kept as the only one: those in memory squashed in memory,
        then merged with those on disk, streamed to disk. Not empty: call when there are
        changes."""
        in_memory = self._in_memory()
        runs = self.runs
        if len(in_memory) > 1:
            runs = [squash(self._indexer, in_memory), *runs[len(in_memory) :]]
        self.runs = [squash(self._indexer, runs, self._store)]
        return self.runs[0]

    def clear(self) -> None:
        """Drop every change (the files of runs on disk go with them)."""
        self.runs = []
