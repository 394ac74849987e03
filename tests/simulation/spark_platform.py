"""The simulated platform through the real Spark runtime: batches are
``StatefulQuery.run_batch`` on a DataFrame, with a real sink, on the tests' Spark session.

Spark routes rows by ``pmod(hash(key), partitions)``; the model names keys per partition, so
each model key of each partition is played by a key Spark routes there (found once per
platform with Spark's own hash). Failures are Spark's: a task's refusal fails the job after
its retries, the sink counts the output (the tasks write) and then raises, and a driver
"dies" by a sink raising what ``run_batch``'s failure handling does not catch.
:class:`SparkMachine` adds a rule only Spark can run: a repartition of the stopped query.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from hypothesis.stateful import rule
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from state_runtime.errors import (
    BatchOutOfOrder,
    CannotLoadState,
    MaintenanceRefused,
    StateStoreError,
)
from state_runtime.identity import StoreId
from state_runtime.maintenance.repartition import repartition
from state_runtime.runtime import StatefulQuery
from state_runtime.runtime.tasks import TaskReport
from tests.simulation.machine import KEYS, PlatformMachine
from tests.simulation.platform import (
    FAIL_KEY,
    INPUT,
    QUERY,
    Batch,
    Between,
    Failure,
    Platform,
    SinkDown,
    TaskFailed,
)


class DriverDied(BaseException):
    """The driver process ends between the tasks and the commit (nothing handles it)."""


class SparkPlatform(Platform):
    """:class:`Platform` whose batches run on Spark (``spark``: set by the test)."""

    spark: ClassVar[SparkSession | None] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.routes = {n: self._route(n) for n in (2, 3)}
        self._pick_keys()

    def _route(self, partitions: int) -> dict[str, int]:
        """Where Spark routes each candidate key on ``partitions`` partitions."""
        assert self.spark is not None
        candidates = [f"{k}{i}" for k in (*KEYS, FAIL_KEY) for i in range(40)]
        routed = self.spark.createDataFrame([(c,) for c in candidates], "k string").select(
            "k", F.expr(f"pmod(hash(k), {partitions})").alias("p")
        )
        return {key: partition for key, partition in routed.collect()}

    def _pick_keys(self) -> None:
        """The key that plays each model key of each partition on the current layout."""
        self.keys: dict[tuple[int, str], str] = {}
        for key, partition in sorted(self.routes[self.partitions].items()):
            self.keys.setdefault((partition, key.rstrip("0123456789")), key)

    def model_changes(self, changes: Batch) -> Batch:
        """The model holds the keys Spark's stores hold (each partition's model key is played
        by a key routed there; partitions beyond the layout's receive nothing)."""
        return {
            p: {self.keys[p, k]: c for k, c in keys.items()}
            for p, keys in changes.items()
            if p < self.partitions
        }

    def repartition(self, partitions: int) -> None:
        """The stopped query moved to ``partitions`` partitions (the library's offline job on
        this Spark session), then started again: a new driver on the new layout."""
        assert self.spark is not None
        repartition(
            self.spark,
            self.fleet,
            self.root,
            QUERY,
            partitions,
            operator_id=0,
            spark_checkpoint="",
            dry_run=False,
            idle=timedelta(0),
        )
        self.partitions = partitions
        self._pick_keys()
        self.restart_driver()

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
            rows.append((self.keys[fail_at, FAIL_KEY], 0, False))
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

    @rule()
    def repartition(self) -> None:
        """The stopped query moves between 2 and 3 partitions; its state must not change."""
        p = self.platform
        if self.model.last is None or not p.committed_refs():
            return  # every store restarted: the query has nothing to move
        target = 5 - p.partitions
        try:
            p.repartition(target)
        except MaintenanceRefused:
            assert p.catalog.problems(root=p.root), "repartition refused, no problem open"
            return
        self.validated = False
        self.model.repartition(target, p.routes[target])
        self.repartitioned_at = self.model.last
        p.last_commit = None  # the commit of the old layout's batch is no longer the catalog's

    def batch(
        self,
        batch_id: int,
        changes: Batch,
        fail: Failure,
        fail_at: int,
        between: Between | None = None,
    ) -> None:
        """As the machine's; a batch at or before the last repartition is one Spark had
        committed (the repartition's precondition) and never runs again: run anyway, it is
        refused before any task runs, and changes nothing."""
        moved = self.repartitioned_at
        if moved is None or batch_id > moved:
            super().batch(batch_id, changes, fail, fail_at, between)
            return
        before, files = self.platform.committed_refs(), self.platform.files()
        try:
            self.platform.run_batch(batch_id, changes)
        except BatchOutOfOrder:
            assert self.platform.committed_refs() == before
            assert self.platform.files() == files, f"refused batch {batch_id} wrote files"
            return
        raise AssertionError(f"batch {batch_id} committed again after the repartition at {moved}")

    def _stores(self) -> list[StoreId]:
        return [StoreId(0, partition) for partition in range(3)]


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
