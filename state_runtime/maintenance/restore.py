"""Restore: return a query's stores to an earlier, intact batch, so the query resumes there.

``plan_restore`` checks, without changing anything, that every store batch ``B`` committed
still loads: its chain of files is complete in the catalog and each file is in storage with
its recorded size and checksum (read and verified now: a past validation's verdict on a delta
does not count). A store whose version at ``B`` does not load is *lost*: the plan refuses,
names its files and the newest batch that is intact (earlier or later), unless the user
accepts the loss (``allow_lost_state``, after Flink's ``--allowNonRestoredState``): such a
store then starts again from empty, and the plan says so.

``restore_query`` carries a plan out, under the stores' leases, as one recorded run (kind
``restore``): it first records the verification of each file the plan found missing or damaged
(failed, as a validation records it: retention then keeps the deltas below such a snapshot, which
the restored version loads from, and health reports it); then one catalog transaction makes ``B``
the query's last committed batch (the runtime's next batch ``B + 1`` builds on it; the later
commit-log entries are listed in the run's counts, their files become orphans whose reason names
the run, and cleanup deletes them under the usual grace, the ledger keeping that reason; before
it, an expired version below a target with the target's id gets its own snapshot and is no
longer expired, so the replay of batch ``B`` can build on it: :mod:`.replay_bases`); then
Spark's own checkpoint is rewound the way a Spark user does it: its ``offsets/N`` and ``commits/N``
files (and ``.N.crc``) for ``N > B`` are moved into ``restored-by-run-<id>/`` inside the checkpoint
(kept, not deleted). Run again after a crash in between, the same command finishes the Spark side.
The query must be stopped while it runs.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state_runtime.catalog import CommitEntry, FileRecord, RunKind, StoreKey
from state_runtime.errors import InvalidArgument, MaintenanceRefused
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance.chains import Verified, walk_chain
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.replay_bases import expired_bases, same_state, write_bases
from state_runtime.maintenance.runs import recorded_run
from state_runtime.store.file_verification import MISSING, UNREADABLE

SPARK_LOGS = ("offsets", "commits")
SPARK_CHECKPOINT = "spark_checkpoint"
"""The key of a batch's recorded metrics (``extra``) under which the runtime notes the
query's Spark checkpoint folder ("" when the query runs without one)."""


@dataclass(frozen=True)
class LostStore:
    """A store whose version at the target batch does not load, and why."""

    key: StoreKey
    version: int
    problem: str


@dataclass(frozen=True)
class SparkRewind:
    """Spark's checkpoint: its last committed batch and the files after the target batch."""

    folder: str
    last_committed: int | None
    later_files: list[str]


@dataclass
class RestorePlan:
    """What a restore will do (a dry run prints it; ``restore_query`` carries it out)."""

    root: str
    query_id: str
    batch_id: int
    last_batch: int
    targets: dict[StoreId, CheckpointRef]
    superseded: list[CommitEntry]
    lost: list[LostStore]
    restarted: list[StoreKey]
    spark: SparkRewind | None
    executed: bool = False
    run_id: int | None = None
    orphaned_files: int = 0
    moved_spark_files: list[str] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)
    """The files the plan read and found missing or damaged (path -> problem)."""
    bases: dict[StoreId, CheckpointRef] = field(default_factory=dict)
    """Expired versions below a target, each given its own snapshot, if its files still load
    it, so that the replay of the batch builds on it
    (:mod:`~state_runtime.maintenance.replay_bases`)."""
    reopened: list[StoreId] = field(default_factory=list)
    """The stores whose base the restore wrote and un-expired."""
    gone_bases: list[StoreId] = field(default_factory=list)
    """The stores whose base changed state and no file loads any more: a loss."""

    def summary(self) -> str:
        """The restore in one line: the batches, done or planned, the stores and what it
        supersedes."""
        head, verb = (
            (f"restore (run {self.run_id})", "returned")
            if self.executed
            else ("restore (dry run)", "returns")
        )
        line = (
            f"{head}: query {self.query_id} below {self.root} {verb} to batch {self.batch_id} "
            f"(last committed batch was {self.last_batch}); {len(self.targets)} store(s), "
            f"{len(self.superseded)} later committed version(s) superseded"
        )
        if self.stayed_expired:
            names = ", ".join(f"{self.root}#{store}" for store in self.stayed_expired)
            line += (
                f"; the base of {len(self.stayed_expired)} store(s) stayed expired (its own "
                f"snapshot could not be written or verified: {names}), so a replay of batch "
                f"{self.batch_id} fails with StateLost; fix the cause (a warning logged, or "
                "the snapshot's open problem) and run this restore again"
            )
        if self.gone_bases:
            names = ", ".join(f"{self.root}#{store}" for store in self.gone_bases)
            line += (
                f"; the base of {len(self.gone_bases)} store(s) is gone (no file loads it: "
                f"{names}), so a replay of batch {self.batch_id} fails with StateLost; the "
                "next batch runs"
            )
        return line

    @property
    def stayed_expired(self) -> list[StoreId]:
        """After execution, the stores whose base the restore could not give its own
        snapshot (``bases`` not ``reopened``): their replay of the batch fails."""
        if not self.executed:
            return []
        return sorted(set(self.bases) - set(self.reopened) - set(self.gone_bases))

    def rows(self) -> list[dict[str, Any]]:
        """One row per store: the version it returns to, whether its state is lost (and why)."""
        lost = {str(x.key): x for x in self.lost}
        rows = []
        for store, ref in sorted(self.targets.items(), key=lambda kv: str(kv[0])):
            name = f"{self.root}#{store}"
            words = f"returns to version {ref.version}"
            if store in self.bases:
                words += self._base_words(store, ref, self.bases[store])
            if name in lost:
                words += (
                    f"; lost, starts again from empty (--allow-lost-state): {lost[name].problem}"
                )
            rows.append(
                {"store": name, "version": ref.version, "lost": name in lost, "detail": words}
            )
        return rows

    def _base_words(self, store: StoreId, target: CheckpointRef, base: CheckpointRef) -> str:
        same = same_state(target, base)
        words = f"; its expired version {base.version}" + (" (the same state) " if same else " ")
        if store in self.gone_bases:
            return words + "is gone: a replay of the batch fails with StateLost"
        if store in self.stayed_expired:
            return words + "stayed expired: a replay of the batch fails with StateLost"
        if self.executed:
            return words + "got its own snapshot, for a replay of the batch"
        return words + "gets its own snapshot" + ("" if same else " if its files still load it")

    def counts(self) -> dict[str, int]:
        return {
            "stores": len(self.targets),
            "superseded_versions": len(self.superseded),
            "restarted_stores": len(self.restarted),
            "orphaned_files": self.orphaned_files,
            "spark_files_moved": len(self.moved_spark_files),
            "bases_reopened": len(self.reopened),
            "bases_gone": len(self.gone_bases),
        }


def plan_restore(
    fleet: Fleet,
    root: str,
    query_id: str,
    batch_id: int,
    *,
    spark_checkpoint: str | None,
    allow_lost_state: bool = False,
) -> RestorePlan:
    """Check that ``batch_id`` of ``query_id`` can be restored and say what restoring does.

    ``spark_checkpoint``: the query's Spark checkpoint folder, or ``""`` when the query runs
    without one (batches driven by ``run_batch``); None is refused with what to pass, since a
    Spark checkpoint left ahead of the catalog makes the next batch fail. Raises
    MaintenanceRefused naming what to do when the restore cannot leave them in agreement.
    """
    catalog = fleet.catalog
    if query_id not in catalog.query_ids(root):
        raise InvalidArgument(
            f"no query {query_id!r} committed below {root} "
            f"(known: {', '.join(catalog.query_ids(root)) or 'none'})"
        )
    history = catalog.commit_history(root, query_id=query_id, limit=1_000_000_000)
    batches = sorted({e.batch_id for e in history})
    targets = {e.key.store: e.ref for e in history if e.batch_id == batch_id}
    if not targets:
        raise InvalidArgument(
            f"batch {batch_id} of query {query_id} is not committed below {root} (its committed "
            f"batches: {_ranges(batches)})"
        )
    moved = [
        x
        for x in catalog.layouts(root).values()
        if x.run_id is not None and x.query_id == query_id and batch_id < x.from_batch - 1
    ]
    if moved:
        raise MaintenanceRefused(
            f"query {query_id} was repartitioned at batch {moved[0].from_batch - 1} (run "
            f"{moved[0].run_id}): its stores before that batch are of another layout; restore "
            f"batch {moved[0].from_batch - 1} or later"
        )
    spark = _spark_side(spark_checkpoint, query_id, batch_id, fleet, root)
    checked = Verified()
    lost = _lost(fleet, root, targets, checked)
    if lost and not allow_lost_state:
        newest = _newest_intact(fleet, root, history, batches[-1] + 1, checked)
        raise MaintenanceRefused(
            f"cannot restore query {query_id} to batch {batch_id}: "
            + "; ".join(x.problem for x in lost)
            + "; "
            + (
                f"batch {newest} is the newest batch whose stores all load: restore it "
                f"(--to-batch {newest}), or accept"
                if newest is not None
                else f"no committed batch of query {query_id} has all its stores intact: accept"
            )
            + " the loss of these stores with --allow-lost-state (they start again from "
            "empty, with the other stores of their operator and partition, while the others "
            f"return to batch {batch_id})"
        )
    lost += _committed_with(root, lost, targets)
    restarted = [x.key for x in lost]
    lost_ids = {k.store for k in restarted}
    superseded = [e for e in history if e.batch_id > batch_id or e.key.store in lost_ids]
    return RestorePlan(
        root=root,
        query_id=query_id,
        batch_id=batch_id,
        last_batch=batches[-1],
        targets=targets,
        superseded=sorted(superseded, key=lambda e: (e.batch_id, str(e.key))),
        lost=lost,
        restarted=restarted,
        spark=spark,
        bases=expired_bases(fleet, root, targets, history, lost_ids),
        damaged={  # verdicts only: a failed read is no failed verification
            path: p
            for path, p in checked.problems.items()
            if p is not None and not p.startswith(UNREADABLE)
        },
    )


def restore_query(fleet: Fleet, plan: RestorePlan, policy: MaintenancePolicy) -> RestorePlan:
    """Carry ``plan`` out (see the module): one recorded run, the stores leased throughout."""
    catalog = fleet.catalog
    keys = [StoreKey(plan.root, store) for store in plan.targets] + [e.key for e in plan.superseded]
    parameters = {
        "root": plan.root,
        "query_id": plan.query_id,
        "to_batch": plan.batch_id,
        "allow_lost_state": bool(plan.restarted),
        "spark_checkpoint": plan.spark.folder if plan.spark else None,
    }
    with recorded_run(
        catalog,
        RunKind.RESTORE,
        fleet.owner,
        parameters,
        policy.status_limits(),
        leases=keys,  # taken as the run starts; given back as it closes
        lease_ttl=policy.lease_ttl,
    ) as run:
        plan.run_id = run.run_id
        if run.busy:
            raise MaintenanceRefused(
                f"{len(run.busy)} store(s) of query {plan.query_id} are leased by another "
                f"maintenance run (e.g. {run.busy[0]}); run the restore again when it ends"
            )
        if plan.damaged:  # failed: retention keeps the chain below a failed snapshot
            catalog.record_verifications(plan.root, plan.damaged)
        written = write_bases(fleet, plan.root, plan.targets, plan.bases, run.run_id, Verified())
        plan.reopened, plan.gone_bases = written.reopened, written.gone
        assert run.held is not None  # taken at its start; renewed by its heartbeat
        run.held.ensure_kept(f"restoring query {plan.query_id} to batch {plan.batch_id}")
        why = (
            f"superseded: query {plan.query_id} restored to batch {plan.batch_id} by run "
            f"{run.run_id}"
        )
        rewound = catalog.rewind_query(
            plan.root,
            plan.query_id,
            plan.batch_id,
            plan.targets,
            restart=[k.store for k in plan.restarted],
            reason=why,
            run_id=run.run_id,
            reopened=plan.reopened,
        )
        plan.superseded = rewound.superseded
        plan.orphaned_files = rewound.orphaned_files
        if plan.spark is not None:
            plan.moved_spark_files = _move_spark_files(plan.spark, run.run_id)
        plan.executed = True
        run.counts = plan.counts() | {
            "superseded": [
                {"store": str(e.key), "batch": e.batch_id, "checkpoint": str(e.ref)}
                for e in plan.superseded
            ]
        }
    return plan


def _lost(
    fleet: Fleet, root: str, targets: dict[StoreId, CheckpointRef], checked: Verified
) -> list[LostStore]:
    """The stores whose version at the target batch does not load from the files kept."""
    lost = []
    for store, ref in sorted(targets.items()):
        key = StoreKey(root, store)
        problem = _problem(fleet, key, ref, checked)
        if problem is not None:
            lost.append(LostStore(key, ref.version, problem))
    return lost


def _committed_with(
    root: str, lost: list[LostStore], targets: dict[StoreId, CheckpointRef]
) -> list[LostStore]:
    """The intact stores of a lost store's operator and partition: an operator's stores (a
    ``transform_with_state`` operator's variables and timers) are one state committed
    together, so they start again from empty with it, never at another batch."""
    hit = {(x.key.store.operator_id, x.key.store.partition_id): x.key.store for x in lost}
    known = {x.key.store for x in lost}
    return [
        LostStore(
            StoreKey(root, store),
            ref.version,
            f"starts again with {hit[store.operator_id, store.partition_id]}, a store of its "
            "operator and partition (committed together)",
        )
        for store, ref in sorted(targets.items())
        if store not in known and (store.operator_id, store.partition_id) in hit
    ]


def _problem(fleet: Fleet, key: StoreKey, ref: CheckpointRef, checked: Verified) -> str | None:
    """Why version ``ref`` of the store does not load from the files kept (None: it loads),
    each file read (:func:`walk_chain`): a broken delta is named, else a snapshot passed over,
    and a snapshot storage cannot read now, which may load it, is named as well."""
    if ref.version == 0:
        return None
    walk = walk_chain(fleet, key, ref.version, checked)
    if walk.loads:
        return None

    def why(record: FileRecord, problem: str) -> str:
        return (
            f"the catalog recorded {record.path} for version {record.version} of store "
            f"{record.key}, and storage "
            f"{'no longer has it' if problem == MISSING else 'has: ' + problem}"
        )

    found = walk.broken or (walk.passed_over[0] if walk.passed_over else None)
    text = (
        why(*found)
        if found is not None
        else f"the catalog has no complete chain of files for version {ref.version} of store "
        f"{key} (deleted or failed files)"
    )
    if walk.unreadable is not None:
        text += (
            f" (storage cannot read the snapshot {walk.unreadable.path} now, which may load "
            "it: try again once it does)"
        )
    return text


def newest_intact_batch(
    fleet: Fleet, root: str, query_id: str, *, checked: Verified | None = None
) -> int | None:
    """The newest committed batch of ``query_id`` at which every store of the query loads,
    each file read and verified (``checked``: what is known already): the batch a restore
    accepts. None if there is none."""
    history = fleet.catalog.commit_history(root, query_id=query_id, limit=1_000_000_000)
    last = max((e.batch_id for e in history), default=-1)
    return _newest_intact(fleet, root, history, last + 1, checked or Verified())


def _newest_intact(
    fleet: Fleet, root: str, history: Sequence[CommitEntry], below: int, checked: Verified
) -> int | None:
    """The newest batch before ``below`` at which every store of the query loads."""
    by_batch: dict[int, dict[StoreId, CheckpointRef]] = {}
    for e in history:
        if e.batch_id < below:
            by_batch.setdefault(e.batch_id, {})[e.key.store] = e.ref
    for batch in sorted(by_batch, reverse=True):
        if not _lost(fleet, root, by_batch[batch], checked):
            return batch
    return None


def _spark_side(
    folder: str | None, query_id: str, batch_id: int, fleet: Fleet, root: str
) -> SparkRewind | None:
    if folder is None:
        raise MaintenanceRefused(
            f"say where query {query_id} keeps its Spark checkpoint: "
            f"{checkpoint_to_pass(fleet, root, query_id)} (its offsets and "
            f"commits after batch {batch_id} are moved aside, so that Spark resumes at the same "
            "batch as the catalog), or --no-spark-checkpoint if the query runs without one; "
            "stop the query first"
        )
    if not folder:
        return None
    path = Path(folder)
    if not (path / "offsets").is_dir():
        raise InvalidArgument(f"{folder} is not a Spark checkpoint: it has no offsets/ folder")
    logs = {name: spark_batches(path / name) for name in SPARK_LOGS}
    last = max(logs["commits"], default=None)
    if batch_id not in logs["offsets"] or batch_id not in logs["commits"]:
        raise MaintenanceRefused(
            f"Spark's checkpoint {folder} has no committed batch {batch_id} (its offsets: "
            f"{_ranges(sorted(logs['offsets']))}; commits: {_ranges(sorted(logs['commits']))}): "
            "Spark cannot resume there; restore a batch that both Spark and the catalog kept"
        )
    later = sorted(
        str(f.relative_to(path))
        for name, found in logs.items()
        for n in found
        if n > batch_id
        for f in (path / name / str(n), path / name / f".{n}.crc")
        if f.exists()
    )
    return SparkRewind(str(path), last, later)


def recorded_spark_checkpoint(fleet: Fleet, root: str, query_id: str) -> str | None:
    """The Spark checkpoint folder the runtime recorded with the query's last batch ("" for
    none); None if it recorded none (the query was not told)."""
    recorded = fleet.catalog.batch_metrics(root, query_id, limit=1)
    found = recorded[0].metrics.extra.get(SPARK_CHECKPOINT) if recorded else None
    return found if isinstance(found, str) else None


def checkpoint_to_pass(fleet: Fleet, root: str, query_id: str) -> str:
    """What a refused command should be given for the query's Spark checkpoint: the option the
    runtime recorded with the last batch, or what to fill in when it recorded none."""
    recorded = recorded_spark_checkpoint(fleet, root, query_id)
    option = spark_checkpoint_option(recorded)
    if recorded is None:
        return f"{option} with DIR its checkpointLocation (the runtime was not told it)"
    return f"{option}, as the runtime recorded with its last batch"


UNKNOWN_SPARK = "--spark-checkpoint DIR"
"""The option of a command whose Spark checkpoint the runtime was not told: DIR to fill in."""


def spark_checkpoint_option(known: str | None) -> str:
    """``--spark-checkpoint DIR``, or ``--no-spark-checkpoint`` for a query that runs without
    one (""), for a command that rewrites a query (restore, repartition); the placeholder
    :data:`UNKNOWN_SPARK` when the folder is not known (None): :func:`run_step` then says
    what DIR is."""
    if known is None:
        return UNKNOWN_SPARK
    return f"--spark-checkpoint {shlex.quote(known)}" if known else "--no-spark-checkpoint"


def run_step(command: str) -> str:
    """ "run `command`"; when the command needs the Spark checkpoint the runtime was not told
    (Spark tells no Connect-safe reader a running query's checkpointLocation), the step
    before it: find DIR, then run the command with it."""
    if UNKNOWN_SPARK not in command:
        return f"run `{command}`"
    return (
        "find the stream's checkpointLocation (its writeStream option; the runtime was not "
        f"told it), then run `{command}` with DIR set to it"
    )


def spark_batches(folder: Path) -> set[int]:
    """The batch numbers logged in a Spark checkpoint's ``offsets`` or ``commits`` folder."""
    return {int(f.name) for f in folder.iterdir() if f.name.isdigit()} if folder.is_dir() else set()


def _move_spark_files(spark: SparkRewind, run_id: int) -> list[str]:
    """Move Spark's offsets and commits after the target batch aside (newest first, so an
    interrupted move leaves Spark's logs a prefix); return what moved."""
    root = Path(spark.folder)
    aside = root / f"restored-by-run-{run_id}"
    moved = []
    for name in sorted(spark.later_files, key=_spark_order, reverse=True):
        source = root / name
        if source.exists():
            target = aside / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(source, target)
            moved.append(name)
    return moved


def _spark_order(name: str) -> tuple[int, bool]:
    """Batch number, then commits before offsets (moved first in reverse order)."""
    return int(Path(name).name.strip(".").removesuffix(".crc")), name.startswith("commits")


def _ranges(numbers: Sequence[int]) -> str:
    """``0-4, 7, 9-10``: consecutive numbers as ranges."""
    if not numbers:
        return "none"
    parts, start, prev = [], numbers[0], numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)
