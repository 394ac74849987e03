"""Progress gates for threaded races: the race is run however loaded the machine is."""

from __future__ import annotations

import threading
import time


class Gates:
    """One event per racing activity, set each time it makes progress (:meth:`made`). A
    writer calls :meth:`passed` between its steps: it waits until every activity has made
    progress since the last call, so each step really races them, while they otherwise run
    freely. Counts of what the activities did then depend on the steps, not on timing."""

    def __init__(self, *names: str, timeout_s: float = 120) -> None:
        self.events = {name: threading.Event() for name in names}
        self.timeout_s = timeout_s

    def made(self, name: str) -> None:
        self.events[name].set()

    def passed(self, stop: threading.Event) -> bool:
        """Wait for progress of every activity (``timeout_s`` at most each, then fail); False
        once ``stop`` is set (an activity failed: the caller stops and reports it)."""
        for name, event in self.events.items():
            waited = time.monotonic()
            while not event.wait(0.05):
                if stop.is_set():
                    return False
                assert time.monotonic() - waited < self.timeout_s, (
                    f"no {name} in {self.timeout_s} s"
                )
            event.clear()
        return not stop.is_set()
