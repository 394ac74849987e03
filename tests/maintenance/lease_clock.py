"""A stepped clock for the maintenance leases: slow work without wall-clock margins."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from state_runtime.catalog import Catalog, Lease
from state_runtime.maintenance import leases


class LeaseClock:
    """The clock the leases' renewals go by (:meth:`now`: this host's monotonic clock plus the
    steps taken; slow storage steps it instead of sleeping, so load cannot stretch the time
    between renewals); ``longest``: the most time any step ended after the leases were taken
    or last renewed (the catalog's calls spied by :meth:`spy`); ``renewals`` counted."""

    def __init__(self) -> None:
        self.stepped, self.longest, self.renewals = 0.0, 0.0, 0
        self.renewed = self.now()

    def now(self) -> float:
        return time.monotonic() + self.stepped

    def step(self, seconds: float) -> None:
        """Let ``seconds`` pass (a slow storage call ending), noting the longest unrenewed."""
        self.stepped += seconds
        self.longest = max(self.longest, self.now() - self.renewed)

    def spy(self, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
        """Note when ``catalog`` takes or renews leases; make :class:`Held` go by :meth:`now`."""
        acquire, renew = catalog.acquire_leases, catalog.renew_leases

        def acquired(*args: Any) -> list[Lease | None]:
            self.renewed = self.now()
            return acquire(*args)

        def renewed(*args: Any) -> list[Lease | None]:
            self.renewed, self.renewals = self.now(), self.renewals + 1
            return renew(*args)

        monkeypatch.setattr(catalog, "acquire_leases", acquired)
        monkeypatch.setattr(catalog, "renew_leases", renewed)
        monkeypatch.setattr(leases, "time", SimpleNamespace(monotonic=self.now))
