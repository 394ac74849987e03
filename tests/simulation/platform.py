"""The platform under simulation, without Spark: one query's stores on real local files and a
real SQLite catalog, driven through the code paths the runtime uses.

A batch is what ``runtime/query.py`` does, minus Spark: ``StatefulQuery`` checks and registers
the query (schemas, layout, order), ``Catalog.begin_batch`` records the intent, each state
partition runs the real task body (``runtime/tasks.run_partitions``: the worker's provider,
``StateStore`` get/put/remove/commit, the ``TaskReport``), and the driver commits the chosen
reports with ``Catalog.commit_batch`` or, when the batch fails, runs the same loss check as
``run_batch`` (``runtime/loss.lost_state``). Maintenance is the library's passes
(``state_runtime.maintenance``), with the clock they are given (``now``) moved by the
simulation. The query and :class:`~.model.Model`, the plain-Python truth every step is
checked against, are in ``model.py``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, IntegerType, StructField, StructType

from state_runtime.catalog import Catalog
from state_runtime.errors import CannotLoadState, CatalogError, StateStoreError
from state_runtime.identity import CheckpointRef, StoreId, parse_file_name
from state_runtime.maintenance import Fleet, MaintenancePolicy
from state_runtime.maintenance.repartition import repartition
from state_runtime.maintenance.restore import SPARK_CHECKPOINT
from state_runtime.maintenance.spark_hash import spark_partition
from state_runtime.retention import RetentionPolicy
from state_runtime.runtime import StatefulOperator, StatefulQuery, worker
from state_runtime.runtime.batch_reports import batch_metrics, choose, duplicates_of
from state_runtime.runtime.coordinator import holders
from state_runtime.runtime.loss import lost_state
from state_runtime.runtime.tasks import (
    HEARTBEAT_COLUMN,
    PARTITION_COLUMN,
    REPORT_COLUMN,
    TaskReport,
    TaskSpec,
    base_refs,
    run_partitions,
)
from state_runtime.settings import WorkerSettings
from state_runtime.storage import LocalStorage, Storage
from state_runtime.store import writer
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.provider import StateStoreProvider
from state_runtime.store.schema_history import SchemaHistory
from tests.simulation.model import FAIL_KEY, INPUT, KEYS, Batch, Change, State, TaskFailed, operator
from tests.simulation.run_folders import sqlite_catalog

QUERY = "simulated"
LAYOUTS = (2, 3)
"""The partition counts the query moves between (``Platform.repartition``)."""
FolderFiles = tuple[tuple[int | None, str, bytes], ...]
"""A store folder's files: version (None: not a checkpoint file's name), path, digest."""
Failure = Literal["task", "sink", "driver"] | None
Stage = Literal["begun", "written"]
Between = Callable[[Stage], None]
"""Called by a batch between its steps: its intent recorded (``begun``), its tasks' files
written (``written``, before the commit)."""


class SinkDown(RuntimeError):
    """The batch's sink failed after the tasks wrote their deltas."""


@dataclass
class Platform:
    """One query's stores on a local root with a SQLite catalog; ``offset`` moves the clock
    maintenance is given (a host's clock step)."""

    folder: Path
    partitions: int = 2
    catalog_url: str = ""
    offset: timedelta = timedelta(0)
    generation: int = 0
    root_name: str = "root"
    """The root's folder in ``folder`` (a name that needs percent-encoding in a URI tests
    that every pass finds the folder the runtime writes to)."""
    recorded_generation: int = 0
    """The generation whose schema the catalog's history ends with (a query records it)."""
    host_step: timedelta = timedelta(0)
    """How far the maintenance host's wall clock was stepped (``step_host_clock``)."""
    driver_step: timedelta = timedelta(0)
    """How far the driver host's wall clock was stepped (``step_driver_clock``): its
    catalog connection's and its tasks' (the writers' stamps)."""
    storage_step: timedelta = timedelta(0)
    """How far the storage's clock was stepped (``step_storage_clock``): the modification
    times of the files written since, which reconcile's in-flight cutoff and the leftover
    sweep read."""
    spark_checkpoint: str | None = None
    """The stream's ``checkpointLocation`` the driver is given (``StatefulQuery``'s)."""
    routed: bool = False
    """Each partition's model keys played by keys Spark's hash routes there (the simulation,
    whose repartitions move rows); else every key is itself (tests driving batches)."""

    def __post_init__(self) -> None:
        self._loaded: dict[tuple[Any, ...], State | StateStoreError] = {}
        """Each load's outcome by its inputs (``load``)."""
        self._digests: dict[str, tuple[tuple[int, int, int, int], bytes]] = {}
        """Each local file's digest by its identity (``_digest``)."""
        self.last_commit: tuple[int, list[CheckpointInfo]] | None = None
        """The last batch this platform committed and its checkpoints (a driver retrying its
        commit sends exactly these again)."""
        self.storage = self.open_root()
        self._local_root = str(self.folder / self.root_name)
        """The root's folder as a string (``_digest`` joins a path to it per file a check)."""
        self.root = self.storage.uri
        self.catalog_url = self.catalog_url or sqlite_catalog(self.folder / "catalog.db")
        self.restart_driver()
        self.catalog = Catalog.open(self.catalog_url)
        """The maintenance process's catalog (the driver's is ``query.catalog``)."""
        self.catalog.clock.wall = self._maintenance_wall
        self.fleet = self.maintenance_fleet()
        self.routes = {n: routes(n) for n in LAYOUTS}
        self._pick_keys()

    def _pick_keys(self) -> None:
        """The key that plays each model key of each partition on the current layout: one
        that Spark's hash routes there, so that a repartition moves no two rows to one key."""
        self.keys: dict[tuple[int, str], str] = {}
        for key, partition in sorted(self.routes[self.partitions].items()):
            self.keys.setdefault((partition, key.rstrip("0123456789")), key)

    def open_root(self) -> Storage:
        """The query's root: a local folder in ``folder``."""
        return LocalStorage(self.folder / self.root_name)

    def maintenance_fleet(self) -> Fleet:
        """The maintenance process's fleet: it opens the root from the catalog's record."""
        return Fleet(self.catalog, owner="simulation")

    def _maintenance_wall(self) -> float:
        return time.time() + self.host_step.total_seconds()

    def step_host_clock(self, step: timedelta) -> None:
        """The maintenance host's wall clock steps (an NTP step, a VM resume): on PostgreSQL
        the catalog's clock notices and reads the database again; a SQLite catalog's clock is
        its host's, so it moves with it."""
        self.host_step += step

    def _driver_wall(self) -> float:
        return time.time() + self.driver_step.total_seconds()

    def step_driver_clock(self, step: timedelta) -> None:
        """The driver host's wall clock steps: the clock of every driver's catalog connection
        (on PostgreSQL it notices and reads the database again; a SQLite catalog's clock, as
        the driver sees it, is the driver's host's) and of the tasks it runs (in local mode,
        on its host), which stamp the files they write."""
        self.driver_step += step

    def step_storage_clock(self, step: timedelta) -> None:
        """The storage's clock steps (a file server's, apart from every host's): the files
        written from now on carry its stamps, by which maintenance ages the files no catalog
        records yet (a batch's before its commit, unfinished writes)."""
        self.storage_step += step

    def _stamp(self, paths: list[str]) -> None:
        """Files just written, stamped by the storage's clock (a local file takes its host's
        time, so the step is set on it)."""
        if not self.storage_step:
            return
        stamp = time.time() + self.storage_step.total_seconds()
        for path in paths:
            os.utime(self.folder / self.root_name / path, (stamp, stamp))

    @contextmanager
    def _on_driver_host(self) -> Iterator[None]:
        """The writers' stamps (``created_at``) by the driver host's clock, to the millisecond
        as ``file_header.now``'s (storage stamps its files' times by its own clock)."""

        def stepped() -> datetime:
            t = datetime.fromtimestamp(self._driver_wall(), UTC)
            return t.replace(microsecond=t.microsecond // 1000 * 1000)

        real, writer.now = writer.now, stepped
        try:
            yield
        finally:
            writer.now = real

    # --- processes ------------------------------------------------------------------------

    def new_query(self) -> None:
        """A new query object (with its own catalog connection: it registers and checks
        again); the one before is done."""
        before = getattr(self, "query", None)
        self.query = self.spare_driver()
        if before is not None:
            before.catalog.close()

    def restart_driver(self) -> None:
        """A new driver process: a fresh query object and catalog connection, and every
        worker's cached copies gone."""
        worker._providers.clear()
        self.new_query()

    def close(self) -> None:
        self.query.catalog.close()
        self.catalog.close()

    def model_changes(self, changes: Batch) -> Batch:
        """A batch's changes as the model records them: the keys the stores hold (each
        partition's model key played by a key routed there; partitions beyond the layout's
        receive nothing)."""
        return {
            p: {self.key(p, k): c for k, c in keys.items()}
            for p, keys in changes.items()
            if p < self.partitions
        }

    def key(self, partition: int, model_key: str) -> str:
        """The key that plays ``model_key`` of ``partition`` (see ``routed``)."""
        return self.keys[partition, model_key] if self.routed else model_key

    def repartition_session(self) -> SparkSession | None:
        """The Spark session a repartition runs on: none, its snapshots are written in this
        process (``write_partitions_locally``)."""
        return None

    def repartition(self, partitions: int) -> None:
        """The stopped query moved to ``partitions`` partitions (the library's offline job),
        then started again: a new driver on the new layout."""
        repartition(
            self.repartition_session(),
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

    def change_schema(self) -> None:
        """The query restarts with an added nullable value field."""
        self.generation = 1
        self.new_query()

    # --- the driver -----------------------------------------------------------------------

    def spare_driver(self) -> StatefulQuery:
        """Another driver's query object, with its own catalog connection (the caller closes
        it): a zombie when the platform's driver took over after it began a batch."""
        query = StatefulQuery(
            QUERY,
            self.storage,
            [operator(self.partitions, self.generation)],
            catalog_url=self.catalog_url,
            spark_checkpoint=self.spark_checkpoint,
        )
        query.catalog.clock.wall = self._driver_wall
        return query

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
        """Batch ``batch_id`` as ``StatefulQuery.run_batch`` runs it, minus Spark: raises what
        the driver raises (``fail``: a task of partition ``fail_at`` refuses a row, the sink
        raises, or the driver dies after the tasks wrote, raising nothing and committing
        nothing). ``between`` is called with ``"begun"`` once the intent is recorded and with
        ``"written"`` once the tasks wrote, before the commit; ``driver``: another driver's
        query object than the platform's."""
        query = driver or self.query
        if not query._registered:
            query._register(batch_id, INPUT)
            self.recorded_generation = self.generation
        op = query.operators[0]
        run = uuid.uuid4().hex
        start = query.catalog.begin_batch(
            self.root, QUERY, batch_id, run, [(0, op.store_name, op.num_partitions)]
        )
        committed = query._committed_before(batch_id, start)
        try:
            if between is not None:
                between("begun")
            reports = self._tasks(query, op, batch_id, run, committed, changes, fail, fail_at)
            if between is not None:
                between("written")
            if fail == "sink":
                raise SinkDown("the sink is down")
            if fail == "driver":
                return reports
            chosen = choose(query.operators, reports)
            assert chosen is not None
            duplicates = duplicates_of(reports, chosen)
            metrics = batch_metrics(chosen, len(duplicates), 0.0, 0.0)
            if query.spark_checkpoint is not None:
                metrics.extra[SPARK_CHECKPOINT] = query.spark_checkpoint
            query.catalog.commit_batch(
                self.root,
                QUERY,
                batch_id,
                [r.info for r in chosen],
                run=run,
                duplicates=[r.info for r in duplicates],
                holders=holders(chosen),
                suspects={r.info.store for r in duplicates},
                metrics=metrics,
            )
            self.last_commit = (batch_id, [r.info for r in chosen])
            return chosen
        except Exception as exc:  # run_batch's loss check, as the runtime runs it
            if not isinstance(exc, CatalogError) and committed:
                lost = lost_state(
                    query.catalog,
                    self.storage,
                    QUERY,
                    batch_id,
                    committed,
                    exc,
                    query.spark_checkpoint,
                )
                if lost is not None:
                    raise lost from None
            raise

    def _tasks(
        self,
        query: StatefulQuery,
        op: StatefulOperator,
        batch_id: int,
        run: str,
        committed: dict[StoreId, CheckpointRef],
        changes: Batch,
        fail: Failure,
        fail_at: int,
    ) -> list[TaskReport]:
        """One task per state partition through the real task body; every task runs (as
        Spark's do), then the first failure is raised."""
        spec = TaskSpec(
            storage=self.storage,
            query_id=QUERY,
            batch_id=batch_id,
            run=run,
            operator=op,
            schema_histories={op.store_name: query._histories[op.operator_id, op.store_name]},
            base=base_refs(committed, op),
            batch_time_ms=0,
            worker_settings=WorkerSettings.from_env(),
        )
        reports: list[TaskReport] = []
        failure: Exception | None = None
        routed = self.model_changes(changes)
        for partition in range(op.num_partitions):
            rows = dict(routed.get(partition, {}))
            if fail == "task" and partition == fail_at:
                rows[FAIL_KEY] = 0
            try:
                with self._on_driver_host():
                    out = list(run_partitions(spec, iter(_rows(partition, rows).to_batches())))
            except TaskFailed as exc:
                failure = failure or exc
                continue
            notes = pa.Table.from_batches(out).column(REPORT_COLUMN).drop_null().to_pylist()
            reports += [TaskReport.from_json(n) for n in notes]
        self._stamp([r.info.path for r in reports if r.info.has_file])
        if failure is not None:
            raise failure
        return reports

    # --- maintenance ----------------------------------------------------------------------

    def now(self) -> datetime:
        """The clock maintenance is given: the catalog's, moved by the simulated steps."""
        return self.catalog.now() + self.offset

    def committed_refs(self) -> dict[int, dict[StoreId, CheckpointRef]]:
        """Each committed batch's checkpoint per store, from the commit log."""
        found: dict[int, dict[StoreId, CheckpointRef]] = {}
        for entry in self.catalog.commit_history(self.root, query_id=QUERY, limit=1_000_000):
            found.setdefault(entry.batch_id, {})[entry.key.store] = entry.ref
        return found

    def load(
        self,
        store: StoreId,
        ref: CheckpointRef,
        history: SchemaHistory | None = None,
        files: FolderFiles | None = None,
    ) -> State:
        """A version's rows as a fresh process loads them from files: raises if it cannot, or
        if it could only by passing over an unusable file (a damaged snapshot: the platform
        calls that store broken until ``repair`` rebuilds it, and so does the model).
        ``history``: the store's schema history, and ``files`` its folder's
        (:meth:`folder_files`), if the caller read them already.

        A load's outcome depends only on the version, the history and the store folder's
        files at or below the version (names and bytes: the loader of version v reads no file
        of a later version, nor lets one change its walk), so it is kept under those: a later
        load with the same inputs (most steps change no file of most stores, and a batch
        writes above every version retained before it) gives it again without decoding; any
        such file written, deleted or damaged, and any name that is no checkpoint file's, is
        another key."""
        history = history or self.catalog.schema_history(
            self.root, store.operator_id, store.store_name
        )
        assert history is not None
        files = self.folder_files(store) if files is None else files
        inputs = tuple(f for f in files if f[0] is None or f[0] <= ref.version)
        key = (store, ref, repr(history.entries), inputs)
        outcome = self._loaded.get(key)
        if outcome is None:
            try:
                outcome = self._load_from_files(store, ref, history)
            except StateStoreError as exc:
                outcome = exc
            self._loaded[key] = outcome
        if isinstance(outcome, StateStoreError):
            raise outcome
        return dict(outcome)

    def folder_files(self, store: StoreId) -> FolderFiles:
        """Every file in the store's folder: its version (None: not a checkpoint file's
        name), path and a digest of its bytes, in path order."""
        return tuple(
            (
                None
                if (name := parse_file_name(info.path.rsplit("/", 1)[-1])) is None
                else name.version,
                info.path,
                self._digest(info.path),
            )
            for info in sorted(self.storage.list(store.directory), key=lambda i: i.path)
        )

    def _digest(self, path: str) -> bytes:
        """A digest of a file's bytes. A local file's is kept under its identity (inode, size,
        modification and change times) once its change time is ``SETTLED`` older than the
        read: any later write or replacement at the path gets a change time at or after the
        read's (the kernel stamps it, ``os.utime`` cannot set it), so an equal identity is
        the same bytes; a file changed within that window is read again at every call. That
        takes change times finer than ``SETTLED``: a digest whose change time has no
        sub-second part (a filesystem stamping whole seconds; elsewhere rare, and merely read
        again) is not kept, as a same-size rewrite with its modification time put back
        within that second would leave the identity equal."""
        if not isinstance(self.storage, LocalStorage):
            return _blake(self.storage.read(path))
        started, stat = time.time_ns(), os.stat(f"{self._local_root}/{path}")
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        kept = self._digests.get(path)
        if kept is not None and kept[0] == identity:
            return kept[1]
        digest = _blake(self.storage.read(path))
        if stat.st_ctime_ns < started - SETTLED and stat.st_ctime_ns % 10**9:
            self._digests[path] = (identity, digest)
        return digest

    def _load_from_files(self, store: StoreId, ref: CheckpointRef, history: SchemaHistory) -> State:
        provider = StateStoreProvider(
            self.storage, store.operator_id, store.partition_id, store.store_name, history=history
        )
        read = provider.get_read_store(ref.version, ref.checkpoint_id)
        if read.metrics.load.repairs:
            raise CannotLoadState(f"{store} {ref} loads only by {read.metrics.load.repairs}")
        return {k[0]: tuple(v) for k, v in read.items()}

    def loads(
        self, store: StoreId, ref: CheckpointRef, history: SchemaHistory | None = None
    ) -> bool:
        try:
            self.load(store, ref, history)
        except StateStoreError:
            return False
        return True

    def files(self) -> list[str]:
        """The checkpoint files in storage (deltas and snapshots), by store, version and kind
        (an order that does not depend on the random checkpoint ids, so that a run replays)."""
        found = [
            PurePosixPath(f.path)
            for f in self.storage.list("state")
            if f.path.endswith((".delta", ".snapshot"))
        ]
        ordered = sorted(found, key=lambda p: (p.parent, int(p.name.split("_")[0]), p.suffix, p))
        return [str(p) for p in ordered]

    def damage(self, path: str, corrupt: bool) -> None:
        """A checkpoint file deleted, or corrupted (one byte flipped), behind the platform's
        back."""
        data = bytearray(self.storage.read(path))
        self.storage.delete([path])
        if corrupt:
            data[len(data) // 2] ^= 0xFF
            self.storage.write_if_absent(path, bytes(data))

    def torn_write(self, partition: int, age: timedelta) -> None:
        """An unfinished write a crashed writer left ``age`` ago in a store's folder (as
        maintenance's clock sees it, stamped by the storage's)."""
        folder = self.folder / self.root_name / StoreId(0, partition).directory
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f".tmp-{uuid.uuid4().hex[:8]}.part"
        path.write_bytes(b"half a delta")
        stamp = (self.now() + self.storage_step - age).timestamp()
        os.utime(path, (stamp, stamp))


SETTLED = 100_000_000
"""Nanoseconds by which a file's change time must precede a read for its digest to be kept
(``Platform._digest``): more than the coarse clock the kernel stamps files by lags the
clock ``time.time_ns`` reads (a tick, 1 to 10 ms)."""


def _blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@functools.cache
def routes(partitions: int) -> dict[str, int]:
    """Where Spark routes each candidate key (a model key and a number) on ``partitions``."""
    candidates = [f"{k}{i}" for k in (*KEYS, FAIL_KEY) for i in range(40)]
    routed = spark_partition([pa.array(candidates)], partitions)
    return dict(zip(candidates, routed.tolist(), strict=True))


def policy(zero: bool, snapshot_min_deltas: int = 2) -> MaintenancePolicy:
    """The default windows, or none at all (``zero``: every pass may act at once); each
    validation is a full one (``verify_sample_percent`` 100): the machine damages files in
    place, keeping their size, and holds every validation to finding them at once."""
    if not zero:
        return MaintenancePolicy(snapshot_min_deltas=snapshot_min_deltas, verify_sample_percent=100)
    return MaintenancePolicy(
        snapshot_min_deltas=snapshot_min_deltas,
        verify_sample_percent=100,
        retention=RetentionPolicy(window=timedelta(0), orphan_grace=timedelta(0)),
        min_window=timedelta(0),
    )


def _input_arrow() -> pa.Schema:
    return to_arrow_schema(
        StructType(
            [
                *INPUT.fields,
                StructField(PARTITION_COLUMN, IntegerType()),
                StructField(HEARTBEAT_COLUMN, BooleanType()),
            ]
        ),
        timezone="UTC",
    )


def _rows(partition: int, changes: Mapping[str, Change]) -> pa.Table:
    """One state partition's input rows, routed, plus its heartbeat row."""
    keys = sorted(changes)
    n = len(keys)
    return pa.Table.from_pydict(
        {
            "k": [*keys, None],
            "delta": [0 if changes[k] is None else changes[k] for k in keys] + [None],
            "drop": [changes[k] is None for k in keys] + [None],
            PARTITION_COLUMN: [partition] * (n + 1),
            HEARTBEAT_COLUMN: [False] * n + [True],
        },
        schema=_input_arrow(),
    )
