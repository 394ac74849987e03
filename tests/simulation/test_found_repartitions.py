"""What the simulation found around a repartition, each shrunk counterexample kept as a fixed
sequence of steps (tests/simulation/steps.py replays it with every invariant checked after
each step); the other findings are test_found.py's.

The retained versions of a store a repartition dropped were fixed by i34-sim, the repartition
after the clock stepped back and after a restore restarted every store by i34-soak, the
store a repartition adds back after such a restore by i34-unique; the others are errors of
the model, fixed in it.
"""

from __future__ import annotations

from datetime import timedelta

from tests.simulation.steps import replay, run


def test_a_store_a_repartition_dropped_retains_no_version() -> None:
    """Found (make test's derandomized runs with repartition in the mix; not shrunk further):
    after a move from 3 to 2 partitions store 2 is out of the layout (latest version 0), and
    the catalog's retained versions listed every commit left in its log, versions cleanup had
    deleted among them, with no files: 'retained versions do not load'. The retained commits
    now stop at the latest version, as the files' retention (``retained_bases``) does."""
    replay(
        [
            ("repartition", {}),
            ("restore", {"allow_lost_state": False, "back": 1, "zero": True}),
            ("validate", {"zero": True}),
            ("restore", {"allow_lost_state": True, "back": 2, "zero": False}),
            (
                "zombie",
                {
                    "at": "written",
                    "changes": {0: {"a": None, "d": None, "c": None}, 2: {"c": None, "b": 3}},
                    "step": -1,
                    "takeover": {2: {"a": None}, 1: {"b": None, "c": None, "a": -2}},
                },
            ),
            ("restore", {"allow_lost_state": True, "back": 3, "zero": True}),
            ("clock_step", {"step": timedelta(days=8)}),
            ("snapshot", {"zero": False}),
            ("sweep_attempts", {"zero": False}),
            ("sweep_attempts", {"zero": True}),
            (
                "raced_batch",
                {
                    "at": "begun",
                    "changes": {1: {"d": None}, 2: {"c": 0}, 0: {"d": 5, "c": -1, "b": 1}},
                    "chore": "sweep_attempts",
                },
            ),
            (
                "raced_batch",
                {
                    "at": "written",
                    "changes": {2: {"c": None, "d": 0}, 1: {"a": 4}},
                    "chore": "reconcile",
                },
            ),
            (
                "raced_batch",
                {
                    "at": "begun",
                    "changes": {
                        1: {"a": -1, "b": None, "c": 2},
                        0: {"b": None, "d": None, "a": None},
                    },
                    "chore": "snapshot",
                },
            ),
            ("cleanup", {"zero": False}),
            ("reconcile", {"zero": True}),
            ("retry_commit", {}),
            ("sweep_attempts", {"zero": True}),
            ("repartition", {}),
        ]
    )


def test_a_repartition_after_the_clock_stepped_back_names_the_skew() -> None:
    """Found (make test's derandomized runs with repartition in the mix, shrunk from 28 steps
    to 2): the maintenance host's clock steps back 30 minutes, which on SQLite (the catalog's
    clock is its host's) puts the driver's last commit in the future; the repartition was
    refused as "committed batch 0 -1800 s ago: it looks running", at idle 0. Whether the
    query still runs cannot be told then, so it is still refused, naming the clock; once the
    clock has passed the commit, it runs."""
    machine = replay(
        [
            ("host_clock_step", {"step": timedelta(minutes=-30)}),
            ("repartition", {}),
            ("host_clock_step", {"step": timedelta(minutes=10)}),
            ("repartition", {}),
            ("host_clock_step", {"step": timedelta(hours=2)}),
            ("repartition", {}),
            run({0: {"a": 2}, 2: {"d": 1}}),
        ]
    )
    assert machine.repartitioned_at == 0 and machine.model.partitions == 3


def test_a_repartition_over_a_damaged_file_fails_and_changes_nothing() -> None:
    """Found (make test's S3 runs with repartition in the mix; a model error): a file of the
    last batch is corrupted behind the platform's back and no validation has run, so no
    problem is open and the plan passes; the repartition then cannot load that store's state
    and fails with its typed load error (naming the store, version and file). The model took
    any failure but a refusal for a defect; the commits and the layout stay as they were."""
    machine = replay(
        [
            ("repartition", {}),
            ("damage", {"pick": 1, "corrupt": True}),
            ("restart", {"driver": True}),
            ("repartition", {}),
        ]
    )
    assert machine.model.partitions == 3 and machine.platform.partitions == 3


def test_a_repartition_after_a_restore_restarted_every_store_is_refused() -> None:
    """Found (make soak, i34-soak, 40 steps; rebuilt in 8): 2 partitions to 3 and back, so
    the commit log keeps store 2's commits of batches 0 and 1 (the store the second move
    dropped); the new layout's snapshots deleted, a restore with --allow-lost-state restarts
    both its stores and drops all their commits. The last commit left in the log was then
    store 2's of batch 0, which the repartition took for the query's last batch and moved
    (the machine saw the catalog's last batch go back to 0). i34-soak refused it ("no store
    of the current layout has a commit"); since i34-unique the restore also drops the
    commits of a store its target batch does not have, so none of the query is left and the
    repartition is refused as an unknown query (InvalidArgument, the machine's rule)."""
    machine = replay(
        [
            ("repartition", {}),
            run({2: {"c": 1}}),
            ("repartition", {}),
            run({0: {"a": 2}}),
            ("damage", {"pick": 6, "corrupt": False}),  # store 1's snapshot of the move
            ("damage", {"pick": 2, "corrupt": False}),  # store 0's
            ("restore", {"back": 0, "allow_lost_state": True, "zero": False}),
            ("repartition", {}),
        ]
    )
    assert machine.platform.partitions == 2 and machine.repartitioned_at == 1


def test_a_batch_refused_after_a_repartition_records_the_new_schema() -> None:
    """Found (make test's derandomized runs with repartition in the mix; a model error):
    after a repartition at batch 0 and a schema change, batch 0 run again is refused before
    any task, but the new query has recorded its widened schema first, so every version now
    loads widened; the model synced its schema generation only after batches that ran."""
    machine = replay([("repartition", {}), ("change_schema", {}), run({}, step=-1)])
    assert machine.model.generation == 1


def test_a_restore_that_restarts_a_partition_a_repartition_added() -> None:
    """A model error found by the soak of integ and by make test's derandomized PostgreSQL
    run (not shrunk further): a restore with ``allow_lost_state`` after a repartition
    restarts a partition the batches before the repartition never had, and the model cleared
    it there too (``IndexError`` in ``Model.rewind``)."""
    replay(
        [
            ("snapshot", {"zero": True}),
            ("run", {"changes": {2: {"a": 2, "d": -1}}, "fail": "sink", "fail_at": 1, "step": -2}),
            (
                "zombie",
                {
                    "at": "begun",
                    "changes": {},
                    "step": 0,
                    "takeover": {2: {"a": None, "b": None, "c": None}},
                },
            ),
            ("cleanup", {"zero": True}),
            ("change_schema", {}),
            (
                "run",
                {
                    "changes": {
                        1: {"d": None, "c": -2, "a": None},
                        2: {"b": None, "d": 2, "c": None},
                    },
                    "fail": "task",
                    "fail_at": 0,
                    "step": 0,
                },
            ),
            (
                "run",
                {
                    "changes": {
                        0: {"b": 2, "c": 5, "d": 3},
                        2: {"d": 2},
                        1: {"d": 0, "c": None, "a": None},
                    },
                    "fail": "task",
                    "fail_at": 1,
                    "step": 0,
                },
            ),
            (
                "run",
                {
                    "changes": {
                        2: {"b": 0, "c": None, "d": 4},
                        1: {"d": 5, "b": -1, "c": None},
                        0: {"c": None, "a": -3, "d": 3},
                    },
                    "fail": None,
                    "fail_at": 0,
                    "step": 0,
                },
            ),
            ("host_clock_step", {"step": timedelta(seconds=600)}),
            ("damage", {"corrupt": True, "pick": 102}),
            (
                "zombie",
                {
                    "at": "written",
                    "changes": {
                        0: {"b": 3},
                        1: {"c": 3, "a": 4, "b": -2},
                        2: {"b": 3, "d": 5, "a": None},
                    },
                    "step": -1,
                    "takeover": {},
                },
            ),
            ("damage", {"corrupt": True, "pick": 109}),
            ("validate", {"zero": True}),
            (
                "run",
                {
                    "changes": {
                        1: {"d": 2, "c": None, "b": -3},
                        0: {"a": -2, "c": 3},
                        2: {"c": None},
                    },
                    "fail": "sink",
                    "fail_at": 1,
                    "step": 0,
                },
            ),
            ("repartition", {}),
            ("snapshot", {"zero": False}),
            ("restart", {"driver": True}),
            ("driver_clock_step", {"step": timedelta(seconds=600)}),
            ("cleanup", {"zero": True}),
            ("damage", {"corrupt": False, "pick": 285}),
            (
                "run",
                {
                    "changes": {0: {"b": None, "c": None, "d": 2}},
                    "fail": None,
                    "fail_at": 1,
                    "step": 1,
                },
            ),
            ("damage", {"corrupt": True, "pick": 445}),
            (
                "zombie",
                {
                    "at": "begun",
                    "changes": {2: {"c": None, "b": -2}},
                    "step": -1,
                    "takeover": {2: {"d": None, "a": None}, 0: {"d": None}, 1: {"c": 5}},
                },
            ),
            ("sweep_attempts", {"zero": False}),
            ("restore", {"allow_lost_state": True, "back": 0, "zero": True}),
        ]
    )


def test_a_store_a_repartition_adds_back_after_a_restart_commits() -> None:
    """Found by the soak (a 52-step run, shrunk by hand to 10 steps): 3 partitions, then 2
    (store 2 out of the layout, its batch-0 entry at version 2 left in the commit log), a
    snapshot raced into a batch and cleanup at zero windows, then a restore to the batch
    before whose state is lost restarts every store. The restore orphaned store 2's files
    (no version of it is the target's) but kept its entry; the stores start again at version
    1, the move back to 3 partitions adds store 2 at version 2 and fails on the commit log's
    (store, version) key, and so did every batch after (``UNIQUE constraint failed:
    commit_log.store_id, commit_log.version``). The restore now removes the entries of a
    store its target batch does not have, as it does a restarted store's."""
    replay(
        [
            ("repartition", {}),
            run({}),
            ("repartition", {}),
            run({}),
            run({}),
            (
                "raced_batch",
                {"at": "begun", "changes": {1: {"c": 3}, 0: {"a": None}}, "chore": "snapshot"},
            ),
            ("cleanup", {"zero": True}),
            ("restore", {"allow_lost_state": True, "back": 2, "zero": True}),
            run({}),
            ("repartition", {}),
        ]
    )
