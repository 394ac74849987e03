"""What stop 58's soak found (two processes, 28 minutes), each shrunk by removing steps and
kept as a fixed sequence of steps (tests/simulation/steps.py replays it with every invariant
checked after each step); each failed before its fix."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.simulation.postgres import machine_on_postgresql
from tests.simulation.steps import Step, replay

EXPIRED_BASE_STILL_LOADS: list[Step] = [
    ("driver_clock_step", {"step": timedelta(hours=2)}),
    ("zombie", {"at": "written", "changes": {}, "step": -1, "takeover": {}}),
    ("raced_batch", {"at": "written", "changes": {}, "chore": "cleanup"}),
    ("raced_batch", {"at": "begun", "changes": {}, "chore": "snapshot"}),
    ("raced_batch", {"at": "written", "changes": {1: {"a": None}}, "chore": "reconcile"}),
    (
        "raced_batch",
        {
            "at": "written",
            "changes": {1: {"a": -3}, 2: {"c": None, "b": 3}, 0: {"d": None, "b": 4}},
            "chore": "snapshot",
        },
    ),
    ("raced_batch", {"at": "written", "changes": {2: {"d": None}}, "chore": "reconcile"}),
    ("restore", {"allow_lost_state": False, "back": 1, "zero": True}),
    (
        "raced_batch",
        {
            "at": "begun",
            "changes": {0: {"d": None}, 2: {"b": -2, "a": None}, 1: {"d": None, "b": None}},
            "chore": "cleanup",
        },
    ),
    ("restore", {"allow_lost_state": False, "back": 2, "zero": True}),
]
"""Store 1's versions 1 to 3 share one checkpoint id (batches 1 and 2 changed nothing in it):
version 1's delta loads all three. A snapshot of version 2, a change at version 4 with its
own snapshot, then cleanup at zero windows inside a batch deletes version 2's snapshot and,
by the rule that a deleted snapshot's versions up to the next snapshot no longer load,
records versions up to 3 expired, though version 1's delta is still there and loads them.
A restore to batch 3 (version 4), then that batch's replay: it builds on version 3."""


def test_a_restore_gives_an_expired_base_that_still_loads_its_own_snapshot() -> None:
    """Found: the replay of the restored batch (the end of the run: the query goes on) failed
    with StateLost ("builds on version 3 of 0/1/default, which expired") while version 3
    loads from files. The restore handled only a base the target left unchanged; it now
    writes any expired base that still loads its own snapshot, and the rewind un-expires it
    (maintenance/replay_bases.py): the replay commits."""
    machine = replay(EXPIRED_BASE_STILL_LOADS)
    assert machine.model.last == 4  # the replay of batch 3 and batch 4 committed


@pytest.mark.postgres
def test_a_restore_gives_an_expired_base_that_still_loads_its_own_snapshot_on_postgresql() -> None:
    with machine_on_postgresql() as on_postgresql:
        machine = replay(EXPIRED_BASE_STILL_LOADS, on_postgresql)
    assert machine.model.last == 4


def test_an_old_driver_whose_base_is_gone_fails_with_its_loss() -> None:
    """Found (a model error): a restore with ``allow_lost_state`` to batch 1, whose base in
    store 1 (batch 0's version 1) is gone (a snapshot of version 2 raced batch 2, and cleanup
    at zero windows deleted version 1's delta, which it superseded); an old driver's replay
    of batch 1 fails with StateLost before any task runs, so before a new driver could take
    it over. That is the loss it is, as a batch's own rule accepts when its bases do not
    load; the zombie rule took it for a defect. The query goes on (its next batch commits)."""
    replay(
        [
            ("raced_batch", {"at": "begun", "changes": {1: {"c": None}}, "chore": "cleanup"}),
            (
                "raced_batch",
                {
                    "at": "written",
                    "changes": {1: {"a": -2, "b": None, "d": 1}, 2: {"c": None}, 0: {"a": 1}},
                    "chore": "snapshot",
                },
            ),
            ("cleanup", {"zero": True}),
            ("restore", {"allow_lost_state": True, "back": 1, "zero": False}),
            (
                "zombie",
                {
                    "at": "written",
                    "changes": {},
                    "step": -1,
                    "takeover": {2: {"a": -1}, 1: {"b": None}, 0: {"d": -3}},
                },
            ),
        ]
    )
