"""The simulation: random interleavings of every operation, checked against the model.

:class:`PlatformMachine` is a hypothesis state machine over :class:`~.platform.Platform`: its
rules are batches (none, some or every store changing; replays, gaps, older batches; task,
sink and driver failures), new query objects and driver processes, a schema change, restore,
snapshot, cleanup, reconcile, the attempt and leftover sweeps, validation, repair and health
at zero and default windows, clock steps (maintenance's, the driver host's between and
inside batches, and the storage's), torn writes, and a file deleted or corrupted. After
every step the invariants hold:

- every retained committed version that loads equals the model (a version never loads wrong);
- every retained version loads, unless a file was deleted or damaged on purpose;
- health calls a store broken only if a retained version of it cannot load, and after a
  validation exactly then;
- no maintenance pass deletes a file that a retained version needed before it ran;
- at the end, the query can go on: a replay of its last batch and the next batch commit.

Each rule's outcome is checked too: a batch in order commits (or raises its own failure,
never a false loss), one out of order is refused before any task runs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from pathlib import PurePosixPath

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from state_runtime.catalog.connection.engine import parse_url, sqlite_file
from state_runtime.errors import (
    AttemptSuperseded,
    BatchOutOfOrder,
    CannotLoadState,
    CommitConflict,
    InvalidArgument,
    MaintenanceRefused,
    StateStoreError,
)
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.maintenance import (
    cleanup_pass,
    plan_restore,
    reconcile,
    repair_pass,
    restore_query,
    run_checks,
    snapshot_pass,
    sweep_attempts,
)
from tests.simulation.catalog_reads import CatalogReads, CatalogVersion
from tests.simulation.model import Batch, Model, TaskFailed
from tests.simulation.platform import (
    LAYOUTS,
    QUERY,
    Between,
    Failure,
    FolderFiles,
    Platform,
    SinkDown,
    Stage,
    policy,
)
from tests.simulation.run_folders import RunFolder
from tests.simulation.strategies import (
    CHORES,
    batches,
    clock_steps,
    failures,
    stages,
    storage_clock_steps,
    weighted,
)

PARTITIONS = 2
"""The query's first layout (``repartition`` moves it between ``LAYOUTS``)."""
STEPS = 0
"""Steps checked in this process (the soak's count)."""


@weighted
class PlatformMachine(RuleBasedStateMachine):
    """One query on the platform; the model holds what its state must be."""

    platform_type: type[Platform] = Platform
    """The platform driven: without Spark, or through the Spark runtime (spark_platform.py)."""
    root_name = "check points+%#é"
    """The root's folder: a name that needs percent-encoding in the root's URI, so that every
    pass must find the folder the runtime writes to."""
    lenient_after_damage = True
    """Whether health may call a store broken while it loads once a file of it was damaged on
    purpose: validation reads a damaged file the loader passes over (a snapshot whose deltas
    still load the version; kept strict in test_found.py where that cannot happen)."""
    catalogs: Callable[[], str] | None = None
    """A fresh catalog's URL per run (postgres.py); None: a SQLite file in the run's folder."""

    def __init__(self) -> None:
        super().__init__()
        with ExitStack() as undo:  # Hypothesis tears down only a machine it got
            self.run_folder = RunFolder()
            undo.callback(self.run_folder.release)
            self.folder = self.run_folder.folder
            url = self.catalogs() if self.catalogs is not None else self.run_folder.catalog()
            self.platform = self.platform_type(
                self.folder,
                partitions=PARTITIONS,
                catalog_url=url,
                root_name=self.root_name,
                routed=True,
            )
            undo.callback(self.platform.close)
            self.catalog_version = CatalogVersion(self.platform.catalog_url)
            undo.pop_all()
        self.model = Model(PARTITIONS)
        self._reads: CatalogReads | None = None
        """The invariants' last catalog reads (``catalog_reads``)."""
        self.damaged = False
        self.damaged_stores: set[StoreId] = set()
        """Stores with a file deleted or corrupted on purpose (see ``lenient_after_damage``)."""
        self.validated = False
        """True from a validation until the next step that may change what loads."""
        self.repartitioned_at: int | None = None
        """The batch at which the query was last repartitioned (restore refuses older ones)."""
        self.skewed = False
        """Whether the driver's clock was ever stepped ahead of the maintenance host's (the
        maintenance host's stepped back, or the driver's ahead)."""

    @initialize()
    def first_batch(self) -> None:
        self.batch(0, {0: {"a": 1}, 1: {"b": 1}}, None, 0)

    def teardown(self) -> None:
        try:
            if not self.damaged and self.model.last is not None:
                self.the_query_goes_on()
        finally:
            with ExitStack() as closing:  # each runs even if one before it raises
                closing.callback(self.run_folder.release)
                closing.callback(self.catalog_version.close)
                closing.callback(self.platform.close)

    def the_query_goes_on(self) -> None:
        """No batch stays uncommittable: the last batch replays without changes, and the
        next one commits."""
        last = self.model.last
        assert last is not None
        self.batch(last, {}, None, 0)
        self.batch(last + 1, {}, None, 0)
        assert self.model.last == last + 1

    # --- the stream ----------------------------------------------------------------------

    @rule(
        step=st.sampled_from([0, 0, 0, 1, -1, -2]),
        changes=batches,
        fail=failures,
        fail_at=st.integers(0, PARTITIONS - 1),
    )
    def run(self, step: int, changes: Batch, fail: Failure, fail_at: int) -> None:
        """The next batch (step 0), a replay of the last one (-1), an older one (-2) or a gap
        (1)."""
        self.batch(self._following(step), changes, fail, fail_at)

    def _following(self, step: int) -> int:
        following = 0 if self.model.last is None else self.model.last + 1
        return max(0, following + step)

    @rule(changes=batches, chore=st.sampled_from(CHORES), at=stages)
    def raced_batch(self, changes: Batch, chore: str, at: Stage) -> None:
        """A maintenance pass at zero windows runs inside the next batch: after its intent is
        recorded, or after its tasks wrote, before its commit. The batch commits; or, when
        cleanup (at zero grace) took the files it wrote, its commit is refused whole and its
        replay commits."""

        def between(stage: Stage) -> None:
            if stage == at:
                getattr(self, chore)(zero=True)

        batch_id = self._following(0)
        try:
            self.batch(batch_id, changes, None, 0, between)
        except CommitConflict as exc:  # zero grace lets cleanup take the attempt's own files
            assert chore == "cleanup" and "cleanup run" in str(exc), exc
            self.batch(batch_id, changes, None, 0)  # refused whole: the replay commits
            assert self.damaged or self.model.last == batch_id, f"batch {batch_id} is stuck"

    @rule(step=st.sampled_from([0, -1]), changes=batches, takeover=batches, at=stages)
    def zombie(self, step: int, changes: Batch, takeover: Batch, at: Stage) -> None:
        """Two drivers, one batch: a driver begins the next batch (or a replay of the last);
        at ``at`` a new driver process takes the query over and runs the same batch with
        other input. The first's late commit is refused and the batch stays the new one's."""
        p, batch_id = self.platform, self._following(step)
        bases_load = batch_id == 0 or self._loads(batch_id - 1)
        old = p.spare_driver()
        taken_over: list[dict[int, dict[StoreId, CheckpointRef]]] = []

        def take_over(stage: Stage) -> None:
            if stage == at:
                p.restart_driver()
                self.batch(batch_id, takeover, None, 0)
                taken_over.append(p.committed_refs())

        try:
            p.run_batch(batch_id, changes, driver=old, between=take_over)
            raise AssertionError(f"the zombie's commit of batch {batch_id} was accepted")
        except AttemptSuperseded:
            assert taken_over, f"batch {batch_id}: a zombie refused with no driver after it"
        except (BatchOutOfOrder, CannotLoadState) as exc:  # the old driver's own failure
            if not taken_over:
                moved = self.repartitioned_at is not None and batch_id <= self.repartitioned_at
                refused = isinstance(exc, BatchOutOfOrder) and moved  # see ``batch``
                lost = isinstance(exc, CannotLoadState) and not bases_load  # as in ``_batch``
                assert self.damaged or refused or lost, (
                    f"the old driver's batch {batch_id} failed: {exc}"
                )
                return
        finally:
            old.catalog.close()
            self.model.generation = p.recorded_generation
        assert p.committed_refs() == taken_over[0], f"the zombie changed batch {batch_id}"

    def batch(
        self,
        batch_id: int,
        changes: Batch,
        fail: Failure,
        fail_at: int,
        between: Between | None = None,
    ) -> None:
        """A batch: it commits, or fails as it must. One at or before the last repartition is
        one Spark had committed (the repartition's precondition) and never runs again: run
        anyway, it is refused before any task runs, and changes nothing."""
        moved = self.repartitioned_at
        if moved is None or batch_id > moved:
            self._batch(batch_id, changes, fail, fail_at, between)
            return
        before, files = self.platform.committed_refs(), self.platform.files()
        try:
            self.platform.run_batch(batch_id, changes)
        except BatchOutOfOrder:
            assert self.platform.committed_refs() == before
            assert self.platform.files() == files, f"refused batch {batch_id} wrote files"
            return
        finally:  # a new query records its schema before the batch's order is checked
            self.model.generation = self.platform.recorded_generation
        raise AssertionError(f"batch {batch_id} committed again after the repartition at {moved}")

    def _batch(
        self,
        batch_id: int,
        changes: Batch,
        fail: Failure,
        fail_at: int,
        between: Between | None,
    ) -> None:
        self.validated = False
        last = self.model.last
        in_order = batch_id == 0 if last is None else last <= batch_id <= last + 1
        bases_load = batch_id == 0 or self._loads(batch_id - 1)
        try:
            try:
                self.platform.run_batch(
                    batch_id, changes, fail=fail, fail_at=fail_at, between=between
                )
            finally:
                self.model.generation = self.platform.recorded_generation
        except BatchOutOfOrder:
            assert not in_order, f"batch {batch_id} refused as out of order after {last}"
            return
        except TaskFailed:
            assert fail == "task" and in_order
            return
        except SinkDown:
            assert fail == "sink" and in_order
            return
        except CannotLoadState:
            assert not bases_load, f"batch {batch_id} ({fail=}): a false loss, every base loads"
            return
        assert in_order, f"batch {batch_id} ran out of order after {last}"
        assert fail in (None, "driver"), f"batch {batch_id}: the {fail} failure was lost"
        if fail is None:
            self.model.commit(batch_id, self.platform.model_changes(changes))

    def _loads(self, batch_id: int) -> bool:
        """Whether every store of committed batch ``batch_id`` loads (from the invariants'
        catalog reads, read again when the catalog changed)."""
        reads, p = self.catalog_reads(), self.platform
        return all(
            p.loads(store, ref, reads.histories.get((store.operator_id, store.store_name)))
            for store, ref in reads.committed.get(batch_id, {}).items()
        )

    @rule()
    def retry_commit(self) -> None:
        """The driver sends its last batch's commit again, byte for byte (it did not see the
        outcome): a no-op (docs/catalog.md)."""
        p, last = self.platform, self.platform.last_commit
        if last is None or last[0] != self.model.last:
            return
        before = p.committed_refs()
        p.catalog.commit_batch(p.root, QUERY, last[0], last[1])
        assert p.committed_refs() == before

    @rule(driver=st.booleans())
    def restart(self, driver: bool) -> None:
        """A new driver process (fresh catalog connection and worker caches), or a new query
        object in the same one."""
        if driver:
            self.platform.restart_driver()
        else:
            self.platform.new_query()

    @precondition(lambda self: self.platform.generation == 0)
    @rule()
    def change_schema(self) -> None:
        self.platform.change_schema()

    @rule(back=st.integers(0, 3), allow_lost_state=st.booleans(), zero=st.booleans())
    def restore(self, back: int, allow_lost_state: bool, zero: bool) -> None:
        last = self.model.last
        assert last is not None
        target = max(0, last - back)
        p = self.platform
        try:
            plan = plan_restore(
                p.fleet,
                p.root,
                QUERY,
                target,
                spark_checkpoint="",
                allow_lost_state=allow_lost_state,
            )
        except MaintenanceRefused:
            if self.repartitioned_at is not None and target < self.repartitioned_at:
                return  # its stores are of the layout before the repartition
            assert not allow_lost_state and not self._loads(target), "restore refused"
            return
        except InvalidArgument:  # every store restarted: the query has no batch to restore
            assert target not in p.committed_refs(), f"batch {target} refused as unknown"
            return
        self._guarded(lambda: restore_query(p.fleet, plan, policy(zero)))
        # The restored window may hold versions no validation has read (a delta corrupted in
        # place after it left the window loads nowhere but is present): what was validated no
        # longer covers every retained version.
        self.validated = False
        restarted = frozenset(k.store.partition_id for k in plan.restarted)
        self.model.rewind(target, restarted)
        p.last_commit = None  # a driver's retry would now undo the operator's restore

    @rule()
    def repartition(self) -> None:
        """The stopped query moves between 2 and 3 partitions, routed by Spark's hash of each
        key; its state must not change. Refused only with a problem open, or when the
        driver's last commit is after the maintenance host's clock, one stepped back or the
        driver's ahead (a SQLite catalog's clock is its host's): the refusal names the clock,
        not "-N s ago"; with no commit left (a restore restarted every store), it is refused
        as an unknown query. It fails
        only when a file of the last batch was damaged on purpose and its state cannot load
        (no validation recorded the problem yet), and changes no commit."""
        p = self.platform
        if self.model.last is None:
            return
        target, before = sum(LAYOUTS) - p.partitions, p.committed_refs()
        if not before:  # every store restarted: the query has no commit left, nothing to move
            try:
                p.repartition(target)
            except InvalidArgument as exc:
                assert "no query" in str(exc), f"repartition of a query with no commit: {exc}"
                return
            raise AssertionError("a query with no commit was repartitioned")
        try:
            p.repartition(target)
        except MaintenanceRefused as exc:
            if "after the catalog's clock now" in str(exc):
                assert self._clock_behind(), f"a clock skew, no clock was stepped back: {exc}"
                return
            assert p.catalog.problems(root=p.root), "repartition refused, no problem open"
            return
        except CannotLoadState as exc:  # a file damaged on purpose, no validation since
            assert self.damaged and not self._loads(self.model.last), f"repartition: {exc}"
            assert p.committed_refs() == before, "a failed repartition changed the commits"
            return
        self.validated = False
        self.model.repartition(target, p.routes[target])
        self.repartitioned_at = self.model.last
        p.last_commit = None  # the commit of the old layout's batch is no longer the catalog's

    def _current_commits(self, committed: dict[int, dict[StoreId, CheckpointRef]]) -> set[int]:
        """The batches a store of the current layout committed (the commit log also keeps
        those of the stores a repartition dropped, before it)."""
        layout = self.platform.partitions
        return {b for b, refs in committed.items() if any(s.partition_id < layout for s in refs)}

    def _clock_behind(self) -> bool:
        """Whether the catalog's clock is behind the query's last commit, as it can be only
        when the catalog's clock follows its hosts' (SQLite) and the maintenance host's wall
        clock was stepped back or the driver's ahead: the driver's commits are on its own
        clock, a repartition's on the maintenance host's as it then was."""
        p = self.platform
        follows_host = sqlite_file(parse_url(p.catalog_url)) is not None
        last = p.catalog.commit_history(p.root, query_id=QUERY, limit=1)[0]
        return follows_host and self.skewed and last.committed_at > p.catalog.now()

    # --- maintenance ---------------------------------------------------------------------

    @rule(zero=st.booleans())
    def snapshot(self, zero: bool) -> None:
        self._guarded(lambda: snapshot_pass(self.platform.fleet, policy(zero)))

    @rule(zero=st.booleans())
    def cleanup(self, zero: bool) -> None:
        p = self.platform
        self._guarded(lambda: cleanup_pass(p.fleet, policy(zero), dry_run=False, now=p.now()))

    @rule(zero=st.booleans())
    def reconcile(self, zero: bool) -> None:
        p = self.platform
        self._guarded(lambda: reconcile(p.fleet, policy(zero), dry_run=False, now=p.now()))

    @rule(zero=st.booleans())
    def sweep_attempts(self, zero: bool) -> None:
        p = self.platform
        self._guarded(lambda: sweep_attempts(p.fleet, policy(zero), dry_run=False, now=p.now()))

    @rule(zero=st.booleans())
    def repair(self, zero: bool) -> None:
        self._guarded(lambda: repair_pass(self.platform.fleet, policy(zero)))

    @rule(zero=st.booleans())
    def validate(self, zero: bool) -> None:
        p = self.platform
        self._guarded(lambda: run_checks(p.fleet, policy(zero), now=p.now()))
        self.validated = True

    @rule(step=clock_steps)
    def clock_step(self, step: timedelta) -> None:
        self.platform.offset += step

    @rule(step=clock_steps)
    def host_clock_step(self, step: timedelta) -> None:
        """The maintenance host's wall clock steps: the catalog's clock must not follow it on
        PostgreSQL (a SQLite catalog's clock is its host's)."""
        self.platform.step_host_clock(step)
        self.skewed = self.skewed or step < timedelta(0)

    @rule(step=clock_steps)
    def driver_clock_step(self, step: timedelta) -> None:
        """The driver host's wall clock steps between batches: the catalog's clock, as the
        driver's connection reads it, must not follow it on PostgreSQL (on SQLite it does)."""
        self._step_driver_clock(step)

    @rule(step=storage_clock_steps)
    def storage_clock_step(self, step: timedelta) -> None:
        """The storage's clock steps: the files written from now on (a batch's, a torn write)
        carry its stamps, by which reconcile's in-flight cutoff and the leftover sweep age
        what no catalog records yet; no invariant changes (a batch raced by a pass at the
        default windows still commits: ``stepped_batch``)."""
        self.platform.step_storage_clock(step)

    @rule(changes=batches, step=clock_steps, at=stages, chore=st.sampled_from([None, *CHORES]))
    def stepped_batch(self, changes: Batch, step: timedelta, at: Stage, chore: str | None) -> None:
        """The driver host's wall clock steps inside the next batch: after its intent is
        recorded (its tasks stamp their files by the stepped clock), or after its tasks wrote;
        then, after the tasks wrote, a maintenance pass at the default windows may run. The
        batch commits: at default windows no pass may take what a batch in flight wrote,
        whichever way the driver's clock went. Only when the clock maintenance is given
        (``clock_step``) is ahead by more than the grace may cleanup take them: then, as in
        ``raced_batch``, the commit is refused whole and the replay commits."""

        def between(stage: Stage) -> None:
            if stage == at:
                self._step_driver_clock(step)
            if stage == "written" and chore is not None:
                getattr(self, chore)(zero=False)

        batch_id = self._following(0)
        try:
            self.batch(batch_id, changes, None, 0, between)
        except CommitConflict as exc:
            grace = policy(False).retention.orphan_grace
            assert chore == "cleanup" and self.platform.offset > grace, exc
            self.batch(batch_id, changes, None, 0)
        assert self.damaged or self.model.last == batch_id, f"batch {batch_id} did not commit"

    def _step_driver_clock(self, step: timedelta) -> None:
        self.platform.step_driver_clock(step)
        self.skewed = self.skewed or step > timedelta(0)

    @rule(partition=st.integers(0, PARTITIONS - 1), hours=st.sampled_from([0, 2, 48]))
    def torn_write(self, partition: int, hours: int) -> None:
        self.platform.torn_write(partition, timedelta(hours=hours))

    @rule(pick=st.integers(0, 1000), corrupt=st.booleans())
    def damage(self, pick: int, corrupt: bool) -> None:
        """A checkpoint file deleted or corrupted behind the platform's back."""
        files = list(self.platform.files())
        if not files:
            return
        self.validated = False
        self.damaged = True
        path = files[pick % len(files)]
        self.damaged_stores.add(StoreId(0, int(PurePosixPath(path).parent.parent.name)))
        self.platform.damage(path, corrupt)

    def _guarded(self, step: Callable[[], object]) -> None:
        """Run a maintenance step; no file a retained version needed before it may go."""
        needed = {f.path for v in self.catalog_reads().retained for f in v.files}
        present = {p for p in needed if self.platform.storage.exists(p)}
        step()
        gone = sorted(p for p in present if not self.platform.storage.exists(p))
        assert not gone, f"maintenance deleted files retained versions need: {gone}"

    # --- invariants ----------------------------------------------------------------------

    def catalog_reads(self) -> CatalogReads:
        """The invariants' catalog reads, read again only when the catalog changed since the
        last ones (on SQLite; on other databases, every time)."""
        version = self.catalog_version()
        if version is not None and self._reads is not None and self._reads.version == version:
            return self._reads
        self._reads = CatalogReads(self.platform, self._stores(), version)
        return self._reads

    def _stores(self) -> list[StoreId]:
        return [StoreId(0, partition) for partition in range(max(LAYOUTS))]

    def _unloadable(self, reads: CatalogReads) -> set[StoreId]:
        """The stores with a retained version that does not load; checks every one that
        loads against the model."""
        p = self.platform
        batch_of = {
            (store, ref): batch
            for batch, refs in reads.committed.items()
            for store, ref in refs.items()
        }
        files: dict[StoreId, FolderFiles] = {}  # each store's folder, read once a check
        broken: set[StoreId] = set()
        for version in reads.retained:
            store = version.key.store
            history = reads.histories.get((store.operator_id, store.store_name))
            if store not in files:
                files[store] = p.folder_files(store)
            try:
                state = p.load(store, version.ref, history, files[store])
            except StateStoreError:
                broken.add(store)
                continue
            batch = batch_of.get((store, version.ref))
            if batch is not None and batch in self.model.states:
                expected = self.model.expected(batch, store.partition_id)
                assert state == expected, (
                    f"{store} version {version.ref} (batch {batch}) loads {state}, "
                    f"the model says {expected}"
                )
        return broken

    @invariant()
    def check(self) -> None:
        """Every invariant, after each step: the state and health of every retained version,
        and the catalog's last committed batch is the model's."""
        global STEPS
        STEPS += 1
        reads = self.catalog_reads()
        self.state_and_health(reads)
        current = self._current_commits(reads.committed)
        if current:  # none when a restore restarted every store
            assert max(current) == self.model.last, f"the catalog's last batch is {max(current)}"

    def state_and_health(self, reads: CatalogReads) -> None:
        unloadable = self._unloadable(reads)
        assert self.damaged or not unloadable, f"retained versions do not load: {unloadable}"
        p = self.platform
        excused = self.damaged_stores if self.lenient_after_damage else set()
        false_alarms = reads.broken - unloadable - excused
        assert not false_alarms, (
            f"health calls {false_alarms} broken, all of it loads: "
            + "; ".join(str(x) for x in p.catalog.problems(root=p.root))
        )
        if self.validated:
            assert unloadable <= reads.broken, f"validation missed {unloadable - reads.broken}"
