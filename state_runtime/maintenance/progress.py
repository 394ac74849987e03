"""Progress of long maintenance work: log lines in Dagster (progress bars in a terminal are the
CLI's, :mod:`state_runtime.cli.progress_bars`).

Passes report through a :class:`Progress`: ``with progress.stage("snapshots", total) as
advance: ... advance(1)``. :data:`SILENT` reports nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

Advance = Callable[[int], None]


class Progress(Protocol):
    def stage(self, description: str, total: int) -> AbstractContextManager[Advance]:
        """A unit of work with ``total`` steps; the context yields ``advance(n)``."""
        ...


class _Silent:
    @contextmanager
    def stage(self, description: str, total: int) -> Iterator[Advance]:
        yield lambda n: None


SILENT: Progress = _Silent()


class CallbackProgress:
    """Calls ``report(description, done, total)`` at the start, at most every ``interval_s``
    seconds, and at the end: for loggers (Dagster's ``context.log``) rather than terminals."""

    def __init__(self, report: Callable[[str, int, int], None], interval_s: float = 10.0) -> None:
        self.report = report
        self.interval_s = interval_s

    @contextmanager
    def stage(self, description: str, total: int) -> Iterator[Advance]:
        done = 0
        last = time.monotonic()
        self.report(description, 0, total)

        def advance(n: int) -> None:
            nonlocal done, last
            done += n
            if time.monotonic() - last >= self.interval_s:
                last = time.monotonic()
                self.report(description, done, total)

        yield advance
        self.report(description, done, total)
