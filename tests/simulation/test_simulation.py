"""The simulation in ``make test``: random interleavings (the same ones every run: seeded, or
derandomized), each step checked against the model (tests/simulation/machine.py), with a
SQLite catalog (shards.py: in a process per CPU) and, fewer, with PostgreSQL and with the root
on S3 (moto's server); ``make soak`` runs fresh random ones for as long as it is given."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.s3_fixtures import MotoS3
from tests.simulation.postgres import machine_on_postgresql
from tests.simulation.s3_platform import S3Machine, S3Platform
from tests.simulation.shards import EXAMPLES, SHARDS, STEPS, run_shards
from tests.simulation.steps import AROUND_A_REPARTITION, replay, run

pytestmark = pytest.mark.slow

RUNS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
"""The fewer runs on PostgreSQL and S3 (the same ones every time: derandomized)."""


def test_the_platform_against_the_model() -> None:
    """Thousands of checked steps (SQLite catalog, local root): the seeded shards of
    shards.py, in processes of their own, as many at once as the host has CPUs."""
    outcome = run_shards(SHARDS, EXAMPLES, STEPS)
    print(outcome.summary())
    if outcome.failures:
        pytest.fail("\n\n".join(outcome.failures), pytrace=False)
    assert outcome.steps >= 2_000, outcome.summary()


@pytest.mark.postgres
def test_the_platform_against_the_model_on_postgresql() -> None:
    with machine_on_postgresql() as machine:
        run_state_machine_as_test(
            machine, settings=settings(RUNS, max_examples=4, stateful_step_count=30)
        )


def test_the_platform_against_the_model_on_s3(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root on moto's S3 server (a fresh bucket per run): a few runs."""
    monkeypatch.setattr(S3Platform, "moto", moto_s3)
    run_state_machine_as_test(
        S3Machine, settings=settings(RUNS, max_examples=3, stateful_step_count=25)
    )


def test_batches_around_repartitions_without_spark() -> None:
    """The library-level repartition (keys routed by Spark's hash in Python): 2 partitions to
    3 and back, batches on each layout (stores idle), snapshot and cleanup at zero windows,
    validation, a restore to the repartitioned batch and one refused before it, and a batch
    at the repartitioned one refused before any task; every version equals the model."""
    machine = replay(
        [
            *AROUND_A_REPARTITION,
            run({}, step=-1),
            run({2: {"c": 1}}),
            ("repartition", {}),
            run({0: {"d": 1}, 1: {"a": -3}}),
        ]
    )
    assert machine.model.partitions == 2 and machine.repartitioned_at == 2


def test_a_restore_to_before_a_delta_corrupted_out_of_the_window() -> None:
    """Found by make test's derandomized runs (a model error): version 1's delta of store 0
    is corrupted in place after a snapshot at version 2 took it out of the retained window,
    so a validation reads nothing of it; a restore to batch 1 retains versions 2 (its
    snapshot loads) and 1 (it does not) again. No validation has read version 1 since, so
    health need not call store 0 broken yet (the model held the earlier validation to it);
    the next validation must, and does."""
    replay(
        [
            run({0: {"a": 1}}),
            ("snapshot", {"zero": True}),
            run({0: {"a": 2}}),
            run({0: {"a": 3}}),
            ("damage", {"pick": 0, "corrupt": True}),  # version 1's delta of store 0
            ("validate", {"zero": False}),
            ("restore", {"back": 2, "allow_lost_state": False, "zero": False}),
            ("validate", {"zero": False}),
        ]
    )
