"""Repartition: change a stopped query's number of state partitions, offline.

``plan_repartition`` reads the catalog and changes nothing: the query's last committed batch
``B``, each operator's current layout (partition count and routing, recorded when the query
started) and the stores' checkpoints at ``B``. It refuses, with MaintenanceRefused naming what
to do, when the query looks running (a batch committed within ``idle``), when a store of the
query has an open validation problem, when the operator's layout is unknown (a query started
before layouts were recorded: run one batch first), or when Spark's checkpoint has not
committed batch ``B`` (Spark would replay it on the old layout).

``estimate_partitions`` (the dry run) routes every key in Spark and counts rows and bytes per
new partition. ``execute_repartition`` carries the plan out as one recorded run (kind
``repartition``) under the leases of every store involved: a Spark job writes one verified
snapshot per new partition at version ``V`` (the next version) with fresh checkpoint ids
(:mod:`state_runtime.maintenance.rerouting`), the files are recorded as written, and one
catalog transaction switches the layout (:mod:`state_runtime.catalog.sql.layouts`): batch ``B``
then names the new snapshots, so the query's next batch opens the new stores, and the
operator's layout says ``N``, so ``StatefulQuery(num_partitions=N)`` is accepted. A crash
before that transaction leaves the old layout (the files written are orphans that cleanup
removes); after it, the new one. Run again, it plans from whichever layout is current.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from state_runtime.catalog import CommitEntry, NewLayout, RunKind, StoreKey
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.identity import CheckpointRef, StoreId, new_checkpoint_id
from state_runtime.maintenance.fleet import Fleet, canonical_root
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.rerouting import (
    Rerouting,
    figures,
    routed,
    write_partitions,
    write_partitions_locally,
)
from state_runtime.maintenance.restore import checkpoint_to_pass, spark_batches
from state_runtime.maintenance.runs import hold_until_close, recorded_run
from state_runtime.units import size

DEFAULT_IDLE = timedelta(seconds=60)
"""How long the query must have committed nothing before a repartition runs."""
CLOCK_NOISE = timedelta(seconds=1)
"""How far two processes' readings of the catalog's clock may part without a clock step: each
reads the database's clock and goes on by its own monotonic clock. A last commit up to this
far after the clock now counts as made just now."""


@dataclass(frozen=True)
class OperatorMove:
    """One operator store's layout change: its checkpoints at the batch and its routing."""

    operator_id: int
    store_name: str
    old_partitions: int
    new_partitions: int
    sources: dict[int, CheckpointRef]
    routing: list[dict[str, object]]


@dataclass(frozen=True)
class PartitionFigure:
    """Rows and bytes (Arrow, before compression) one new partition receives."""

    operator_id: int
    store_name: str
    partition: int
    rows: int
    bytes: int


@dataclass
class RepartitionPlan:
    """What a repartition will do (a dry run prints it; ``execute_repartition`` does it)."""

    root: str
    query_id: str
    batch_id: int
    num_partitions: int
    version: int
    moves: list[OperatorMove]
    spark_checkpoint: str | None
    figures: list[PartitionFigure] = field(default_factory=list)
    executed: bool = False
    run_id: int | None = None
    switched: dict[str, int] = field(default_factory=dict)

    def skew(self, operator_id: int, store_name: str) -> float | None:
        """The largest new partition's rows over the mean (1.0: even); None before figures."""
        rows = [
            f.rows
            for f in self.figures
            if (f.operator_id, f.store_name) == (operator_id, store_name)
        ]
        if not rows or not sum(rows):
            return None
        return max(rows) / (sum(rows) / len(rows))

    def layout_change(self) -> str:
        """Each operator store's change in words: ``operator 0 (default) 4 -> 16, ...``."""
        return ", ".join(
            f"operator {m.operator_id} ({m.store_name}) {m.old_partitions} -> {m.new_partitions}"
            for m in self.moves
        )

    def summary(self) -> str:
        """The repartition in one line: the layout change, done or planned."""
        head = f"repartition (run {self.run_id})" if self.executed else "repartition (dry run)"
        return (
            f"{head}: query {self.query_id} below {self.root} at batch {self.batch_id}: "
            f"{self.layout_change()}; new snapshots at version {self.version}"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per new store: the rows and bytes it receives (as written once executed,
        in Arrow before), and its operator's skew (largest partition over the mean)."""
        bytes_as = "as written (compressed)" if self.executed else "in Arrow (uncompressed)"
        rows = []
        for f in sorted(self.figures, key=lambda f: (f.operator_id, f.store_name, f.partition)):
            skew = self.skew(f.operator_id, f.store_name)
            rows.append(
                {
                    "store": f"{self.root}#{f.operator_id}/{f.partition}/{f.store_name}",
                    "rows": f.rows,
                    "bytes": f.bytes,
                    "detail": f"{f.rows:,} rows, {size(f.bytes)} {bytes_as}"
                    + ("" if skew is None else f"; operator skew {skew:.2f}"),
                }
            )
        return rows

    def counts(self) -> dict[str, int]:
        return {
            "operators": len(self.moves),
            "old_stores": sum(m.old_partitions for m in self.moves),
            "new_stores": sum(m.new_partitions for m in self.moves),
            "rows": sum(f.rows for f in self.figures),
            "bytes": sum(f.bytes for f in self.figures),
        } | self.switched


def plan_repartition(
    fleet: Fleet,
    root: str,
    query_id: str,
    num_partitions: int,
    *,
    operator_id: int | None = None,
    spark_checkpoint: str | None,
    idle: timedelta = DEFAULT_IDLE,
) -> RepartitionPlan:
    """Check that ``query_id`` can move to ``num_partitions`` partitions, and say how.

    ``operator_id`` narrows it to one operator (all its stores); by default every operator of
    the query moves. ``spark_checkpoint``: the query's Spark checkpoint folder, or ``""`` when
    the query runs without one; None is refused with what to pass.
    """
    catalog = fleet.catalog
    root = canonical_root(root)
    if isinstance(num_partitions, bool) or not 1 <= num_partitions <= 100_000:
        raise InvalidArgument(f"--partitions {num_partitions}: expected 1..100000")
    if query_id not in catalog.query_ids(root):
        raise InvalidArgument(
            f"no query {query_id!r} committed below {root} "
            f"(known: {', '.join(catalog.query_ids(root)) or 'none'})"
        )
    last = catalog.commit_history(root, query_id=query_id, limit=1)[0]
    batch_id = last.batch_id
    committed = catalog.committed_ids(root, query_id, batch_id)
    operators = sorted(
        {(s.operator_id, s.store_name) for s in committed}
        if operator_id is None
        else {(s.operator_id, s.store_name) for s in committed if s.operator_id == operator_id}
    )
    if not operators:
        raise InvalidArgument(
            f"query {query_id} has no operator {operator_id} below {root} (its operators: "
            f"{sorted({s.operator_id for s in committed})})"
        )
    _check_idle(fleet, query_id, last, idle)
    if spark_checkpoint is None:
        raise MaintenanceRefused(
            f"say where query {query_id} keeps its Spark checkpoint: "
            f"{checkpoint_to_pass(fleet, root, query_id)} (it must have committed the "
            "catalog's last batch, or Spark replays that batch on the old layout), or "
            "--no-spark-checkpoint if the query runs without one"
        )
    _check_spark(spark_checkpoint, query_id, batch_id)
    layouts = catalog.layouts(root)
    moves = []
    for key in operators:
        layout = layouts.get(key)
        if layout is None:
            raise MaintenanceRefused(
                f"operator {key[0]} (store {key[1]}) of query {query_id} has no layout in the "
                "catalog (the query started before layouts were recorded): run one batch with "
                "this version, stop the query, then repartition"
            )
        sources = {
            s.partition_id: ref
            for s, ref in committed.items()
            if (s.operator_id, s.store_name) == key
        }
        moves.append(
            OperatorMove(
                key[0], key[1], layout.num_partitions, num_partitions, sources, layout.routing
            )
        )
    if all(m.old_partitions == num_partitions for m in moves):
        raise InvalidArgument(
            f"query {query_id} already runs on {num_partitions} partition(s)"
            + ("" if operator_id is None else f" for operator {operator_id}")
        )
    involved = {
        StoreKey(root, StoreId(m.operator_id, p, m.store_name)) for m in moves for p in m.sources
    }
    problems = [p for p in catalog.problems(root=root) if p.key in involved]
    if problems:
        raise MaintenanceRefused(
            f"{len(problems)} open validation problem(s) on the stores of query {query_id} "
            f"(e.g. {problems[0]}): repair or resolve them first (`statestore validate`, "
            "`statestore repair`), then repartition"
        )
    version = max(ref.version for m in moves for ref in m.sources.values()) + 1
    return RepartitionPlan(
        root=root,
        query_id=query_id,
        batch_id=batch_id,
        num_partitions=num_partitions,
        version=version,
        moves=moves,
        spark_checkpoint=spark_checkpoint,
    )


def estimate_partitions(
    spark: SparkSession, fleet: Fleet, plan: RepartitionPlan, *, progress: Progress = SILENT
) -> RepartitionPlan:
    """Route every key in Spark and fill in the plan's rows and bytes per new partition."""
    found: list[PartitionFigure] = []
    with progress.stage("routing keys", len(plan.moves)) as advance:
        for move in plan.moves:
            counted = figures(routed(spark, _rerouting(fleet, plan, move)))
            for partition in range(move.new_partitions):
                rows, size = counted.get(partition, (0, 0))
                found.append(
                    PartitionFigure(move.operator_id, move.store_name, partition, rows, size)
                )
            advance(1)
    plan.figures = found
    return plan


def execute_repartition(
    spark: SparkSession | None,
    fleet: Fleet,
    plan: RepartitionPlan,
    policy: MaintenancePolicy,
    *,
    progress: Progress = SILENT,
) -> RepartitionPlan:
    """Carry ``plan`` out (see the module): one recorded run, every store leased throughout.
    ``spark`` None: the new snapshots are written in this process
    (:func:`~state_runtime.maintenance.rerouting.write_partitions_locally`)."""
    catalog = fleet.catalog
    parameters = {
        "query_id": plan.query_id,
        "batch_id": plan.batch_id,
        "partitions": plan.num_partitions,
        "operators": [[m.operator_id, m.store_name] for m in plan.moves],
        "spark_checkpoint": plan.spark_checkpoint,
    }
    with recorded_run(
        catalog,
        RunKind.REPARTITION,
        fleet.owner,
        parameters,
        policy.status_limits(),
        lease_ttl=policy.lease_ttl,  # its heartbeat renews the leases held until its close
    ) as run:
        plan.run_id = run.run_id
        schemas = {
            (r.key.store.operator_id, r.key.store.store_name): r
            for r in catalog.stores(plan.root)
            if r.key_schema is not None
        }
        keys: set[StoreKey] = set()
        for move in plan.moves:
            record = schemas[move.operator_id, move.store_name]
            stores = [
                StoreId(move.operator_id, p, move.store_name) for p in range(move.new_partitions)
            ]
            added = stores[move.old_partitions :]
            if added:  # one transaction for the move's new partitions
                catalog.register_stores(plan.root, added, record.key_schema, record.value_schema)
            keys.update(StoreKey(plan.root, store) for store in stores)
            keys.update(
                StoreKey(plan.root, StoreId(move.operator_id, p, move.store_name))
                for p in move.sources
            )
        # Held to the run's close, which gives them back in its own transaction.
        held = hold_until_close(catalog, run, list(keys), fleet.owner, policy.lease_ttl)
        if held.busy:
            raise MaintenanceRefused(
                f"{len(held.busy)} store(s) of query {plan.query_id} are leased by another "
                f"maintenance run (e.g. {held.busy[0]}); run the repartition again when "
                "it ends"
            )
        snapshots = []
        with progress.stage("writing new partitions", len(plan.moves)) as advance:
            for move in plan.moves:
                rerouting = _rerouting(fleet, plan, move)
                written = (
                    write_partitions_locally(rerouting)
                    if spark is None
                    else write_partitions(spark, rerouting)
                )
                bad = {p: w.problem for p, w in written.items() if w.problem is not None}
                if bad or set(written) != set(range(move.new_partitions)):
                    raise MaintenanceRefused(
                        f"operator {move.operator_id} (store {move.store_name}): new "
                        f"snapshots missing or failing verification: {bad or 'missing'}; "
                        "nothing was switched, run the repartition again"
                    )
                infos = [written[p].info for p in sorted(written)]
                catalog.record_files(plan.root, infos, run_id=run.run_id)
                snapshots += infos
                plan.figures += [
                    PartitionFigure(
                        move.operator_id, move.store_name, p, w.info.rows, w.info.bytes_written
                    )
                    for p, w in sorted(written.items())
                ]
                advance(1)
        held.ensure_kept(f"switching query {plan.query_id} to its new layout")
        switch = catalog.switch_layout(
            plan.root,
            plan.query_id,
            plan.batch_id,
            {
                StoreId(m.operator_id, p, m.store_name): ref
                for m in plan.moves
                for p, ref in m.sources.items()
            },
            snapshots,
            [
                NewLayout(m.operator_id, m.store_name, m.new_partitions, m.routing)
                for m in plan.moves
            ],
            reason=_reason(plan, run.run_id),
            run_id=run.run_id,
        )
        plan.switched = {
            "entries_replaced": switch.replaced,
            "entries_removed": switch.removed,
            "entries_added": switch.added,
            "orphaned_files": switch.orphaned_files,
        }
        plan.executed = True
        run.counts = plan.counts()
    return plan


def repartition(
    spark: SparkSession | Callable[[], SparkSession] | None,
    fleet: Fleet,
    root: str,
    query_id: str,
    num_partitions: int,
    *,
    operator_id: int | None = None,
    spark_checkpoint: str | None,
    dry_run: bool = True,
    policy: MaintenancePolicy | None = None,
    idle: timedelta = DEFAULT_IDLE,
    progress: Progress = SILENT,
) -> RepartitionPlan:
    """Plan a repartition and estimate it (``dry_run``, the default) or carry it out.

    ``spark`` is the session, or a function that starts one: called only once the plan has
    passed every check that needs only the catalog and the Spark checkpoint folder (an unknown
    query, a folder that is no Spark checkpoint, a batch too recent), so that a refusal costs
    no JVM start. None: no Spark at all, the snapshots written in this process (small
    stores; a dry run's estimate needs Spark)."""
    plan = plan_repartition(
        fleet,
        root,
        query_id,
        num_partitions,
        operator_id=operator_id,
        spark_checkpoint=spark_checkpoint,
        idle=idle,
    )
    session = spark() if callable(spark) else spark
    if dry_run:
        if session is None:
            raise InvalidArgument("a repartition's dry run estimates in Spark: give a session")
        return estimate_partitions(session, fleet, plan, progress=progress)
    return execute_repartition(
        session, fleet, plan, policy or MaintenancePolicy(), progress=progress
    )


def _reason(plan: RepartitionPlan, run_id: int) -> str:
    return (
        f"superseded: query {plan.query_id} repartitioned at batch {plan.batch_id} by run "
        f"{run_id} ({plan.layout_change()})"
    )


def _rerouting(fleet: Fleet, plan: RepartitionPlan, move: OperatorMove) -> Rerouting:
    history = fleet.catalog.schema_history(plan.root, move.operator_id, move.store_name)
    if history is None:
        raise InvalidArgument(
            f"the catalog records no schema for operator {move.operator_id}, store "
            f"{move.store_name} below {plan.root}"
        )
    return Rerouting(
        storage=fleet.storage(plan.root),
        operator_id=move.operator_id,
        store_name=move.store_name,
        history=history,
        sources=move.sources,
        routing=move.routing,
        num_partitions=move.new_partitions,
        version=plan.version,
        checkpoint_ids={p: new_checkpoint_id() for p in range(move.new_partitions)},
    )


def _check_idle(fleet: Fleet, query_id: str, last: CommitEntry, idle: timedelta) -> None:
    """Refuse while the query looks running. A last commit after the catalog's clock (a clock
    stepped back: on SQLite the catalog's clock is its host's) tells nothing of how long the
    query has been quiet, whatever ``idle`` is: refused naming the skew, not as "-N s ago"."""
    now = fleet.catalog.now()
    quiet = now - last.committed_at
    if quiet < -CLOCK_NOISE:
        raise MaintenanceRefused(
            f"query {query_id} committed batch {last.batch_id} at "
            f"{last.committed_at.isoformat(timespec='seconds')}, {-quiet.total_seconds():.0f} s "
            f"after the catalog's clock now ({now.isoformat(timespec='seconds')}): a clock was "
            "stepped back or the hosts' clocks disagree, so whether the query still runs "
            "cannot be told. Check the hosts' time sync; repartition once the clock has passed "
            f"{(last.committed_at + idle).isoformat(timespec='seconds')} with the query stopped",
            setting="idle",
            value=quiet,
            limit=idle,
        )
    quiet = max(quiet, timedelta(0))
    if quiet < idle:
        raise MaintenanceRefused(
            f"query {query_id} committed batch {last.batch_id} {quiet.total_seconds():.0f} s "
            f"ago: it looks running. Stop it and repartition once it has committed nothing for "
            f"{idle.total_seconds():.0f} s",
            setting="idle",
            value=quiet,
            limit=idle,
        )


def _check_spark(folder: str, query_id: str, batch_id: int) -> None:
    if not folder:
        return
    path = Path(folder)
    if not (path / "offsets").is_dir():
        raise InvalidArgument(f"{folder} is not a Spark checkpoint: it has no offsets/ folder")
    commits = spark_batches(path / "commits")
    if batch_id not in commits or max(commits) != batch_id:
        raise MaintenanceRefused(
            f"Spark's checkpoint {folder} has not committed batch {batch_id} as its last batch "
            f"(its commits: {sorted(commits)[-5:] or 'none'}), the catalog's last for query "
            f"{query_id}: on restart Spark would replay it on the old layout. Restart the "
            "query until Spark commits it, stop it, then repartition"
        )
