"""Progress bars for ``statestore``: a :class:`~state_runtime.maintenance.Progress` on rich."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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

from state_runtime.maintenance.progress import Advance


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
