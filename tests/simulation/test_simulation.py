"""The simulation in ``make test``: a few thousand steps of random interleavings, each
checked against the model (see tests/simulation/machine.py; ``make soak`` runs it for hours)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from tests.simulation.machine import PlatformMachine

PlatformMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
TestPlatform = PlatformMachine.TestCase
