"""A simulation run's slot (run_folders.py) is freed whatever way its machine ends: a machine
whose setup fails (Hypothesis never tears it down) and one whose teardown fails."""

from __future__ import annotations

import pytest

from tests.simulation import run_folders
from tests.simulation.machine import PlatformMachine


def fails() -> str:
    raise RuntimeError("no PostgreSQL today")


def test_a_failed_setup_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PlatformMachine, "catalogs", staticmethod(fails))
    with pytest.raises(RuntimeError, match="no PostgreSQL"):
        PlatformMachine()
    assert not run_folders._taken, f"slot leaked: {run_folders._taken}"


def test_a_failed_teardown_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = PlatformMachine()
    shared = machine.run_folder.shared
    assert run_folders._taken == {machine.run_folder.slot}
    monkeypatch.setattr(machine.platform, "close", fails)
    with pytest.raises(RuntimeError, match="no PostgreSQL"):
        machine.teardown()
    assert not run_folders._taken, f"slot leaked: {run_folders._taken}"
    assert not shared.exists()
    monkeypatch.undo()
    machine.platform.close()
