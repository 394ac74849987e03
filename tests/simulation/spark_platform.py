"""The simulated platform through the real Spark runtime: batches are
``StatefulQuery.run_batch`` on a DataFrame, with a real sink, on the tests' Spark session.

Spark routes rows by ``pmod(hash(key), partitions)``; the model names keys per partition, so
each model key of each partition is played by a key Spark routes there (found once per
platform with Spark's own hash). Failures are Spark's: a task's refusal fails the job after
its retries, the sink counts the output (the tasks write) and then raises, and a driver
"dies" by a sink raising what ``run_batch``'s failure handling does not catch.
In :class:`SparkMachine` a repartition of the stopped query runs as Spark's job.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from pyspark.sql import DataFrame, SparkSession

from state_runtime.errors import (
    CannotLoadState,
    StateStoreError,
)
from state_runtime.runtime import StatefulQuery
from state_runtime.runtime.tasks import TaskReport
from tests.simulation.machine import PlatformMachine
from tests.simulation.model import FAIL_KEY, INPUT, KEYS, Batch, TaskFailed
from tests.simulation.platform import (
    Between,
    Failure,
    Platform,
    SinkDown,
)


class DriverDied(BaseException):
    """The driver process ends between the tasks and the commit (nothing handles it)."""


class SparkPlatform(Platform):
    """:class:`Platform` whose batches run on Spark (``spark``: set by the test)."""

    spark: ClassVar[SparkSession | None] = None

    def repartition_session(self) -> SparkSession | None:
        return self.spark

    def run_batch(
        self,
        batch_id: int,
        changes: Batch,
        *,
        fail: Failure = None,
        fail_at: int = 0,
        between: Between | None = None,
        driver: StatefulQuery | None = None,
    ) -> list[TaskReport]:
        """As :meth:`Platform.run_batch`; ``between`` runs in the sink: ``begun`` before its
        action runs the tasks (the intent is recorded by then), ``written`` after."""
        assert self.spark is not None
        query = driver or self.query
        rows = [
            (k, 0 if c is None else c, c is None)
            for keys in self.model_changes(changes).values()
            for k, c in sorted(keys.items())
        ]
        if fail == "task":
            rows.append((self.key(fail_at, FAIL_KEY), 0, False))
        df = self.spark.createDataFrame(rows, INPUT)

        def sink(output: DataFrame, _: int) -> None:
            if between is not None:
                between("begun")
            output.count()  # the tasks run and write their deltas
            if between is not None:
                between("written")
            if fail == "sink":
                raise SinkDown("the sink is down")
            if fail == "driver":
                raise DriverDied()

        try:
            result = query.run_batch(df, batch_id, sink=sink)
        except DriverDied:
            return []
        except StateStoreError:
            raise
        except Exception as exc:  # Spark's error around a task's
            if "refused a row" in str(exc):
                raise TaskFailed(str(exc)[:200]) from None
            if "[STATE_" in str(exc):
                why = str(exc)[:300]
                raise CannotLoadState(f"a task failed to load its state: {why}") from None
            raise
        finally:
            if query._registered:
                self.recorded_generation = self.generation
        result.release()
        self.last_commit = (batch_id, result.infos)
        return result.reports


class SparkMachine(PlatformMachine):
    platform_type = SparkPlatform
    root_name = "root"  # roots that need encoding: the library-level run
    platform: SparkPlatform


def spark_steps(seed: int, count: int) -> list[tuple[str, dict[str, Any]]]:
    """A random sequence of steps for the Spark run (mostly batches)."""
    import random

    rng = random.Random(seed)
    steps: list[tuple[str, dict[str, Any]]] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.55:
            changes = {
                p: {k: rng.choice([None, 1, 2, -1]) for k in rng.sample(KEYS, rng.randint(1, 2))}
                for p in range(3)
                if rng.random() < 0.6
            }
            fail = rng.choice([None, None, None, "sink", "task", "driver"])
            steps.append(
                (
                    "run",
                    {
                        "step": rng.choice([0, 0, 0, -1, 1]),
                        "changes": changes,
                        "fail": fail,
                        "fail_at": rng.randint(0, 1),
                    },
                )
            )
        else:
            name = rng.choice(
                ["snapshot", "cleanup", "validate", "restore", "restart", "clock", "repartition"]
            )
            zero = rng.random() < 0.5
            if name == "restore":
                steps.append(("restore", {"back": 1, "allow_lost_state": False, "zero": zero}))
            elif name == "restart":
                steps.append(("restart", {"driver": rng.random() < 0.5}))
            elif name == "repartition":
                steps.append(("repartition", {}))
            elif name == "clock":
                steps.append(("clock_step", {"step": timedelta(days=8)}))
            else:
                steps.append((name, {"zero": zero}))
    return steps
