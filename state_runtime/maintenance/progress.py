"""Progress of long maintenance work: rich progress bars in a terminal, log lines in Dagster.

Passes report through a :class:`Progress`: ``with progress.stage("snapshots", total) as
advance: ... advance(1)``. :data:`SILENT` reports nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichBars

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


class RichProgress:
    """Progress bars on a rich console (stderr by default, so output stays parseable)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    @contextmanager
    def stage(self, description: str, total: int) -> Iterator[Advance]:
        bars = RichBars(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        with bars:
            task = bars.add_task(description, total=total)
            yield lambda n: bars.advance(task, n)


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
