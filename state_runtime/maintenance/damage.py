"""The fate of a damaged file: one classification that every tool gives.

A snapshot or delta the catalog recorded may be gone from storage, truncated or altered.
What that costs, and the command that gets the store back, depend on the files kept beside
it, so ``repair`` (dry run and execute), ``explain``, ``validate``, ``health`` and the
runtime's loss report all ask :func:`classify`, and each names the same next command:

- ``repairable``: a snapshot whose version still loads from intact deltas below it:
  ``statestore --root ROOT repair --store STORE --execute`` rebuilds it;
- ``older only``: the store's latest version loads without the file; only older retained
  versions needed it (a restore to them would fail): the store goes on, those versions leave
  retention as the query commits (cleanup then deletes the file), and ``statestore resolve``
  records meanwhile that the loss is accepted (a validation before then finds it again);
- ``restorable``: the latest version does not load; batch N is the newest committed batch
  of the query at which every store loads (the batch ``restore`` accepts, computed by the
  same code): ``statestore restore ROOT --query Q --to-batch N ... --execute``;
- ``lost``: no committed batch has every store intact: only ``--allow-lost-state`` goes on
  (the store starts again from empty, the others stay at the last batch).

The intact deltas below a snapshot and the restorable batch are judged from the catalog's
records and the files themselves (each read and verified, and the chains walked as
``restore`` walks them: a failed snapshot that reads intact now is a base again).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from state_runtime.catalog import FileRecord, FileState, StoreKey, StoreProblem, Verdict
from state_runtime.identity import FileKind
from state_runtime.maintenance.chains import Verified, walk_chain
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.restore import (
    newest_intact_batch,
    recorded_spark_checkpoint,
    run_step,
    spark_checkpoint_option,
)
from state_runtime.store.file_verification import MISSING


class Fate(StrEnum):
    REPAIRABLE = "repairable"
    OLDER_ONLY = "older only"
    RESTORABLE = "restorable"
    LOST = "lost"


@dataclass(frozen=True)
class Damage:
    """A damaged (missing, truncated, altered) file, its fate and the next command."""

    key: StoreKey
    file: FileRecord
    cause: str
    fate: Fate
    command: str
    query_id: str | None = None
    batch: int | None = None
    """The batch to restore: the newest intact one (restorable), the last one (lost)."""

    @property
    def advice(self) -> str:
        """What the damage costs and the command to run, in one sentence."""
        v = self.file.version
        if self.fate is Fate.REPAIRABLE:
            return f"version {v} still loads from the intact deltas below it; run `{self.command}`"
        if self.fate is Fate.OLDER_ONLY:
            return (
                "the store's latest version loads without it (only older retained versions "
                "needed it: they leave retention as the query commits, and cleanup then "
                f"deletes the file); to accept their loss until then, run `{self.command}`"
            )
        if self.fate is Fate.RESTORABLE:
            return (
                f"the store does not load; batch {self.batch} is the newest batch of query "
                f"{self.query_id} whose stores all load; stop the query, {run_step(self.command)} "
                "and start it again"
            )
        return (
            f"no committed batch of query {self.query_id} has all its stores intact: the "
            f"store's state is lost; to start it again from empty (the other stores keep "
            f"batch {self.batch}), stop the query, {run_step(self.command)} and start it again"
        )

    def paragraph(self, *, store: bool = True) -> str:
        """The store (unless the reader has it), the file, the cause and the advice: what
        every tool prints."""
        f = self.file
        where = f"store {self.key}: " if store else ""
        return (
            f"{where}{f.kind.value} {f.path} (version {f.version}) {_as_cause(self.cause)}; "
            f"{self.advice}"
        )

    def details(self) -> dict[str, object]:
        """The classification as plain fields (``--json``)."""
        return {
            "store": str(self.key),
            "file": self.file.path,
            "version": self.file.version,
            "cause": self.cause,
            "fate": self.fate.value,
            "command": self.command,
            "query_id": self.query_id,
            "batch": self.batch,
        }


def _as_cause(cause: str) -> str:
    return "is missing from storage" if cause == MISSING else f"is damaged: {cause}"


def classify(
    fleet: Fleet,
    damaged: FileRecord,
    cause: str,
    *,
    spark_checkpoint: str | None = None,
    checked: Verified | None = None,
) -> Damage:
    """The fate of ``damaged`` (found ``cause``: missing, or what verification found) and
    the next command. ``spark_checkpoint``: the query's Spark checkpoint folder if the caller
    knows it ("" for none); otherwise the one the runtime recorded with the last batch."""
    key = damaged.key
    checked = checked or Verified()
    checked.problems[damaged.path] = cause
    root = shlex.quote(key.root)

    def loads(version: int) -> bool:
        """Whether ``version`` loads without ``damaged``, as restore judges it."""
        return walk_chain(fleet, key, version, checked).loads

    if damaged.kind is FileKind.SNAPSHOT and loads(damaged.version):
        command = f"statestore --root {root} repair --store {key.store} --execute"
        return Damage(key, damaged, cause, Fate.REPAIRABLE, command)
    (record,) = fleet.stores([key])
    if record.latest.version > damaged.version and loads(record.latest.version):
        reason = shlex.quote(f"older versions lost with {damaged.path}")
        command = f"statestore --root {root} resolve --store {key.store} --reason {reason}"
        return Damage(key, damaged, cause, Fate.OLDER_ONLY, command)
    history = fleet.catalog.commit_history(key.root, store=key.store, limit=1)
    query_id = history[0].query_id if history else "QUERY"
    batch = newest_intact_batch(fleet, key.root, query_id, checked=checked)
    fate = Fate.RESTORABLE if batch is not None else Fate.LOST
    if batch is None:
        batch = history[0].batch_id if history else 0
    if spark_checkpoint is None:
        spark_checkpoint = recorded_spark_checkpoint(fleet, key.root, query_id)
    spark = spark_checkpoint_option(spark_checkpoint)
    command = (
        f"statestore restore {root} --query {shlex.quote(query_id)} --to-batch {batch} {spark}"
        + (" --allow-lost-state" if fate is Fate.LOST else "")
        + " --execute"
    )
    return Damage(key, damaged, cause, fate, command, query_id, batch)


@dataclass(frozen=True)
class DamageReport:
    """The damaged files in scope, classified, and the open problems that name none (a
    commit log that is not linear, a version with no file in the catalog)."""

    damages: list[Damage]
    other: list[StoreProblem]

    def of(self, *fates: Fate) -> list[Damage]:
        return [d for d in self.damages if d.fate in fates]

    def beyond_repair(self) -> DamageReport:
        """What repair does not fix: the files it cannot rebuild, the other problems."""
        return DamageReport([d for d in self.damages if d.fate is not Fate.REPAIRABLE], self.other)


def damaged_files(
    fleet: Fleet, policy: MaintenancePolicy, only: Collection[StoreKey] | None = None
) -> DamageReport:
    """Every damaged file in scope, classified: the snapshots the retention rule calls
    damaged (their verification failed) and the committed files the open problems name,
    each read and verified again now (one that verifies is no damage)."""
    found: dict[tuple[StoreKey, str], FileRecord] = {}
    other: list[StoreProblem] = []
    only = key_set(only)
    for root in fleet.query_roots(only):
        for verdict in fleet.catalog.file_verdicts(policy.retention, root=root):
            f = verdict.file
            if verdict.verdict is Verdict.DAMAGED and fleet.in_scope(f.key, only):
                found[(f.key, f.path)] = f
        for p in fleet.catalog.problems(root=root):
            if not fleet.in_scope(p.key, only):
                continue
            record = _committed(fleet, p.key, p.path)
            if record is None:
                other.append(p)
            elif (p.key, record.path) not in found:
                found[(p.key, record.path)] = record
    checks: dict[str, Verified] = {}
    damages = []
    for record in found.values():
        checked = checks.setdefault(record.key.root, Verified())
        cause = checked.problem(fleet, record.key.root, record)  # the read now, not the old note
        if cause is not None:
            damages.append(classify(fleet, record, cause, checked=checked))
    return DamageReport(damages, other)


def _committed(fleet: Fleet, key: StoreKey, path: str | None) -> FileRecord | None:
    """The committed file at ``path`` of ``key``, if the catalog has one."""
    if path is None:
        return None
    files = fleet.catalog.store_files(key.root, key.store)
    return next((f for f in files if f.path == path and f.state == FileState.COMMITTED), None)
