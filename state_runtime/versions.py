"""Committed versions in memory: one materialized dict and the other versions as diffs from it.

A :class:`StateMap` owns one ``dict`` holding the state of its *head* version. Every other
live version of the same lineage family is a :class:`VersionView` whose ``diff`` records,
for the keys where it differs from the head, its own value (or ``ABSENT``). Committing a new
version on top of any view costs O(changes): the head dict is updated in place and the
inverse of the change is added to the diffs of the other live views. No version ever copies
the whole map.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, Final

from state_runtime.identity import CheckpointRef


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()
"""Marks a removed key in a diff or in a store's pending changes."""

Key = tuple[Any, ...]
Value = tuple[Any, ...]
Diff = dict[Key, "Value | _Absent"]


class VersionView:
    """One version of the state: the head dict seen through ``diff``."""

    __slots__ = ("__weakref__", "diff", "lineage", "ref", "rows", "state_map")

    def __init__(
        self,
        state_map: StateMap,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        rows: int,
        diff: Diff,
    ) -> None:
        self.state_map = state_map
        self.ref = ref
        self.lineage = lineage
        self.rows = rows
        self.diff = diff

    def get(self, key: Key) -> Value | None:
        if self.diff:
            found = self.diff.get(key, None)
            if found is not None:
                return None if found is ABSENT else found  # type: ignore[return-value]
        return self.state_map.data.get(key)

    def __contains__(self, key: Key) -> bool:
        return self.get(key) is not None

    def items(self) -> Iterator[tuple[Key, Value]]:
        diff = self.diff
        data = self.state_map.data
        if not diff:
            yield from data.items()
            return
        for key, value in data.items():
            if key not in diff:
                yield key, value
        for key, change in diff.items():
            if change is not ABSENT:
                yield key, change  # type: ignore[misc]


class StateMap:
    """The materialized dict of one lineage family and its live versions."""

    def __init__(
        self,
        data: dict[Key, Value],
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
    ) -> None:
        self.data = data
        self._views: weakref.WeakSet[VersionView] = weakref.WeakSet()
        self.head = self._register(VersionView(self, ref, lineage, len(data), {}))

    def _register(self, view: VersionView) -> VersionView:
        self._views.add(view)
        return view

    def derive(
        self,
        parent: VersionView,
        changes: Diff,
        ref: CheckpointRef,
        lineage: tuple[CheckpointRef, ...],
        rows: int,
        *,
        keep_parent: bool = True,
    ) -> VersionView:
        """The version ``parent`` + ``changes`` (with ``rows`` rows), made the new head.

        O(len(changes)). ``changes`` is taken over: the caller must not modify it afterwards.
        With ``keep_parent=False`` the parent view is retired (no one may use it again), which
        saves keeping its inverse diff.
        """
        assert parent.state_map is self
        if not keep_parent:
            self._views.discard(parent)
        if parent.diff:
            diff: Diff = dict(parent.diff)
            diff.update(changes)
        else:
            diff = changes
        child = self._register(VersionView(self, ref, lineage, rows, diff))
        self._advance_head(child)
        return child

    def _advance_head(self, view: VersionView) -> None:
        data = self.data
        inverse: Diff = {}
        for key, change in view.diff.items():
            inverse[key] = data.get(key, ABSENT)
            if change is ABSENT:
                data.pop(key, None)
            else:
                data[key] = change  # type: ignore[assignment]
        for other in list(self._views):
            if other is view:
                continue
            other_diff = other.diff
            for key, old in inverse.items():
                if key not in other_diff:
                    other_diff[key] = old
        view.diff = {}
        self.head = view


def count_row_change(base: VersionView, changes: Diff) -> int:
    """How many rows ``changes`` adds (positive) or removes (negative) relative to ``base``."""
    delta = 0
    for key, change in changes.items():
        delta += (change is not ABSENT) - (base.get(key) is not None)
    return delta
