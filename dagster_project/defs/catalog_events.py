"""What happened outside Dagster, reported to Dagster: maintenance runs and batch metrics.

Maintenance runs from the CLI, the library or a Spark job are recorded in the catalog like
Dagster's own. The ``state_catalog_events`` sensor reads the runs it has not seen (a cursor on
the catalog's position of a run, at most ``RUNS`` a tick, never past a run still running) and,
when some were not started by Dagster, requests a ``state_catalog_report_job`` run for them
(its run key names the range: a range is reported once). That run logs the same events a
run in Dagster records: a snapshot, cleanup or reconcile run as a materialization of its
asset, a validation as the evaluations of the fleet-wide checks it recorded, then each
store's state on its partition, the per-store checks and the fleet's totals
(``store_events.py``). A run, not runless events: Dagster 1.13 keeps a single runless
evaluation per check and partition (a unique index on run id and partition), so per-store
checks could be reported only once. The first tick reports
every store's current state and the latest validation (and so does a tick that finds the
newest store partition changed: new stores get theirs), so that the stores no validation has
checked show *unknown* (a warning) from the start, never a green tick.

The sensor also reports the batches the runtime recorded as runless materializations of
``state_batch_metrics``, whose metadata names the query: ``<query>/commit_ms``,
``<query>/rows_in``, ... Dagster plots each numeric metadata key against its events'
timestamps, so each query's figures form their own lines, each point at the time the runtime
recorded its batch (its commit), not at the sensor's tick (:func:`report_batches`). A page of
batches (``PAGE``) has one event a batch while it holds at most ``EVENTS`` batches, else one a
run of consecutive batches, ``len(page) / EVENTS`` a run, with each query's newest batch in
it to plot and every batch's figures in ``batch_figures`` (JSON rows): at most ``EVENTS``
events a page, whatever its batches and queries, where one a batch cost a tick 3 to 5 ms a
batch of Dagster's storage (10 to 14 s at 20,000 stores and 2,000 batches under load). Each
batch is reported exactly once. Both cursors are the catalog's positions (its writing
transaction, then its id: ``state_runtime/catalog/sql/positions.py``), read only once every
older writing transaction ended, so a row that commits after a newer one was read (two
drivers racing on PostgreSQL) still sorts after the cursor. An event carries its newest
batch's position (``catalog_metrics_xact``, ``catalog_metrics_id``), a tick starts after the
newer of its cursor and the newest position Dagster already holds, and writes in position
order (a page's events in one call to the event log, at most ``TICK_BATCHES`` batches a
tick), so a tick that failed partway (its cursor not saved) is continued by the next, never
repeated.

A tick that finds nothing while newer rows wait for an open writing transaction (anywhere on
the PostgreSQL server: another database, a forgotten ``PREPARE TRANSACTION``) says so in its
skip reason, with the oldest one's age when the catalog's role may see it.

It only reads the catalog and reports: it runs from the start.
"""

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    Config,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    MetadataValue,
    OpExecutionContext,
    RunConfig,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    op,
    sensor,
)
from dagster._core.events import StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
from pydantic import Field

from dagster_project.defs.checkpoints import GROUP, state_checkpoints
from dagster_project.defs.jobs import KIND_TAG
from dagster_project.defs.metadata import MetadataMap
from dagster_project.defs.partitions import state_stores
from dagster_project.defs.resources import MaintenanceResource
from dagster_project.defs.store_events import (
    BLOCKING,
    Reported,
    changed_store_events,
    fleet_materialization,
)
from state_runtime.catalog import (
    Catalog,
    MaintenanceRun,
    Position,
    RecordedBatchMetrics,
    RunKind,
    RunOutcome,
    Unsettled,
)
from state_runtime.maintenance import CHECKS, HealthSpool, StoreNames, store_report_pages
from state_runtime.units import millis, size

RUNS = 50
PAGE = 1_000  # batches read from the catalog at once, their events written at once
TICK_BATCHES = 20_000  # at most this many a tick: 40,000 a minute at the 30 s interval
EVENTS = 200  # a page's events at most: one a batch up to this many, then runs (docs)
METRICS_ID = "catalog_metrics_id"  # an event's newest batch: its id...
METRICS_XACT = "catalog_metrics_xact"  # ...and its transaction (the catalog's position)
RUN_ASSETS = {
    RunKind.SNAPSHOT.value: AssetKey("state_snapshots"),
    RunKind.CLEANUP.value: AssetKey("state_retention_cleanup"),
    RunKind.RECONCILE.value: AssetKey("state_reconciliation"),
}
PER_STORE = {check.name.value for check in CHECKS if check.per_store}

state_batch_metrics = AssetSpec(
    key="state_batch_metrics",
    description=(
        "Each committed micro-batch's figures (rows in, keys updated, bytes written, commit "
        "and batch time, cache hit rate), one materialization per batch reported by the "
        "state_catalog_events sensor; metadata keys name the query (<query>/commit_ms), so "
        "the Plots tab draws each query's figures over time."
    ),
    group_name=GROUP,
    kinds={"spark"},
)


def position(value: int | list[int]) -> Position:
    """A position as a cursor or a run's config holds it, ``[transaction, id]``; an id alone
    is a cursor from before the catalog recorded transactions (the rows recorded then sort
    first, at transaction 0)."""
    return Position(0, value) if isinstance(value, int) else Position(*value)


def pair(at: Position) -> list[int]:
    return [at.xact, at.row]


@dataclass(frozen=True)
class Cursor:
    """The positions of the last run and batch metrics reported (``run`` is None before the
    first tick), and the newest store partition (its storage id, as Dagster's page cursor
    says it: new stores get their state reported)."""

    run: Position | None = None
    metrics: Position = field(default_factory=Position)
    partitions: str = ""

    @classmethod
    def parse(cls, text: str | None) -> "Cursor":
        if not text:
            return cls()
        found = json.loads(text)
        run = found["run"]
        return cls(  # a cursor from before partitions were followed has none: report them all
            None if run is None else position(run),
            position(found["metrics"]),
            found.get("partitions", ""),
        )

    def text(self) -> str:
        run = None if self.run is None else pair(self.run)
        return json.dumps(
            {"run": run, "metrics": pair(self.metrics), "partitions": self.partitions}
        )


def stalled(waiting: Unsettled) -> str:
    """What a quiet tick adds when rows wait for an older writing transaction of the
    PostgreSQL server to end (``sql/positions.py``): how many, and for how long the oldest
    open one has been open, if the catalog's role may see it."""
    if not waiting.rows:
        return ""
    age = (
        "not visible to the catalog's role (grant it pg_read_all_stats to see it)"
        if waiting.oldest_write is None
        else f"open for {waiting.oldest_write.total_seconds():.0f} s"
    )
    return (
        f"; {waiting.rows} newer rows wait until every older writing transaction on the "
        f"PostgreSQL server ends (the oldest, or a prepared one, {age}; pg_stat_activity, "
        "pg_prepared_xacts)"
    )


def newest_partition(instance: DagsterInstance) -> str:
    """The newest store partition's storage id (a page cursor): it changes whenever stores get
    partitions, and is one row to read where listing them is 2 s at 100,000 (docs)."""
    name = state_stores.name or ""
    return instance.get_paginated_dynamic_partitions(name, limit=1, ascending=False).cursor


def _by(run: MaintenanceRun) -> str:
    return f"{run.kind} run {run.run_id} by {run.owner}"


def _in_dagster(run: MaintenanceRun) -> bool:
    return run.owner.startswith("dagster:")


def finished_outside(
    runs: Sequence[tuple[Position, MaintenanceRun]],
) -> tuple[list[MaintenanceRun], Position | None]:
    """The runs up to the first one still running (the cursor stops before it), the ones not
    started by Dagster among them, and the position to continue after."""
    done: list[tuple[Position, MaintenanceRun]] = []
    for at, run in runs:
        if run.outcome == RunOutcome.RUNNING.value:
            break
        done.append((at, run))
    last = done[-1][0] if done else None
    return [r for _, r in done if not _in_dagster(r)], last


def described_by(catalog: Catalog, after: Position) -> Reported:
    """The runs outside Dagster since ``after`` whose findings a state read now holds: the
    newest ``RUNS`` runs visible now (Dagster's own among them; not only those below an older
    transaction still open, as a cursor reads), whether older ones are left out, and the
    newest validation among them."""
    found = catalog.runs_after(after, limit=RUNS + 1, newest=True, settled=False)
    outside = [r for _, r in found[-RUNS:] if not _in_dagster(r)]
    named = [_by(r) for r in outside]
    if len(found) > RUNS:
        named.append(f"and older runs (over {RUNS} since)")
    validations = [_by(r) for r in outside if r.kind == RunKind.VALIDATE.value]
    return Reported(
        "; ".join(named) or "the stores' state in the catalog",
        validations[-1] if validations else "",
    )


def run_events(run: MaintenanceRun) -> list[AssetMaterialization | AssetCheckEvaluation]:
    """A finished run's own events: its asset's materialization, or a validation's checks."""
    about = f"{_by(run)}, {run.outcome}"
    if run.outcome != RunOutcome.SUCCEEDED.value:
        return []
    if run.kind == RunKind.VALIDATE.value:
        return [
            AssetCheckEvaluation(
                asset_key=state_checkpoints.key,
                check_name=name,
                passed=bool(verdict["passed"]),
                severity=AssetCheckSeverity.ERROR
                if verdict["severity"] == "error"
                else AssetCheckSeverity.WARN,
                description=f"{about}: {verdict['summary']}",
                metadata=_verdict_metadata(run, verdict),
                blocking=name in {b.value for b in BLOCKING},
            )
            for name, verdict in sorted(run.counts.get("checks", {}).items())
        ]
    asset = RUN_ASSETS.get(run.kind)
    if asset is None:
        return []
    return [AssetMaterialization(asset, description=about, metadata=_run_metadata(run))]


def _run_metadata(run: MaintenanceRun) -> MetadataMap:
    metadata: MetadataMap = {
        "catalog_run_id": MetadataValue.int(run.run_id),
        "run_by": MetadataValue.text(run.owner),
    }
    for name, value in run.counts.items():
        if isinstance(value, int) and not isinstance(value, bool):
            metadata[name] = MetadataValue.int(value)
            if name.endswith("_bytes"):
                metadata[name.removesuffix("_bytes") + "_size"] = MetadataValue.text(size(value))
    if run.ended_at is not None:
        metadata["duration_s"] = MetadataValue.float(
            round((run.ended_at - run.started_at).total_seconds(), 1)
        )
    return metadata


def _verdict_metadata(run: MaintenanceRun, verdict: dict[str, Any]) -> MetadataMap:
    metadata: MetadataMap = {
        name: MetadataValue.float(float(value))
        for name, value in verdict.get("figures", {}).items()
    }
    metadata["catalog_run_id"] = MetadataValue.int(run.run_id)
    metadata["run_by"] = MetadataValue.text(run.owner)
    if verdict.get("failing_stores"):
        metadata["failing_stores"] = MetadataValue.json(verdict["failing_stores"])
    return metadata


def reported_through(instance: DagsterInstance) -> Position:
    """The newest catalog position of batch metrics Dagster holds (the start: none, or only
    events from before it was recorded; transaction 0: events from before transactions were):
    the batches are written in position order, so every older one is there too."""
    found = instance.fetch_materializations(state_batch_metrics.key, limit=1).records
    event = found[0].asset_event if found else None
    metadata = event.metadata if event is not None else {}

    def number(key: str) -> int:
        value = metadata.get(key)
        return value.value if value is not None and isinstance(value.value, int) else 0

    return Position(number(METRICS_XACT), number(METRICS_ID))


BatchRun = Sequence[tuple[Position, RecordedBatchMetrics]]


def batch_runs(page: BatchRun) -> list[BatchRun]:
    """A page's batches in runs of consecutive ones (in position order), a run each event: one batch
    each while the page has at most ``EVENTS``, else ``len(page) / EVENTS``, so a page writes
    at most ``EVENTS`` events whatever its batches and queries."""
    size = -(-len(page) // EVENTS)
    return [page[start : start + size] for start in range(0, len(page), size)]


def _figure(value: int | float) -> MetadataValue:
    return MetadataValue.int(value) if isinstance(value, int) else MetadataValue.float(value)


def batch_figures(run: BatchRun, names: StoreNames) -> MetadataValue:
    """Every batch's figures, a row each: past ``EVENTS`` batches a page the plots take each
    query's newest batch in a run, this keeps each batch. JSON rows, a third of a table's
    bytes (Dagster serializes a table's schema with each event), and the events' bytes are
    most of what a tick writes."""
    rows: list[dict[str, str | int | float]] = []
    for _, recorded in run:
        row: dict[str, str | int | float] = {
            "query": names.labels.get(recorded.root, recorded.query_id),
            "batch": recorded.batch_id,
            "committed_at": recorded.recorded_at.isoformat(),
        }
        for name, value in recorded.metrics.figures().items():
            row[name] = value if isinstance(value, int) else round(value, 3)
        rows.append(row)
    return MetadataValue.json(rows)


def batch_run_event(run: BatchRun, names: StoreNames) -> AssetMaterialization:
    """A run of consecutive batches: each query's newest batch in it, its figures under
    ``<query>/<figure>`` (the query's label, see ``StoreNames``), so each query's figures plot
    as their own lines, and every batch's in ``batch_figures``; ``committed_at`` the run's
    newest batch's commit (the catalog's time, the event's own: the plotted point's x), to the
    second where the plots' axis shows minutes; ``catalog_metrics_xact`` and
    ``catalog_metrics_id`` (the newest batch's position) say which batches Dagster holds."""
    newest, recorded = run[-1]
    label = names.labels.get(recorded.root, recorded.query_id)
    metadata: MetadataMap = {
        METRICS_XACT: MetadataValue.int(newest.xact),
        METRICS_ID: MetadataValue.int(newest.row),
        "query": MetadataValue.text(label),
        "batch": MetadataValue.int(recorded.batch_id),
        "batches": MetadataValue.int(len(run)),
        "committed_at": MetadataValue.timestamp(recorded.recorded_at),
        "root": MetadataValue.path(recorded.root),
    }
    for _, batch in run:  # each query's newest batch last
        query = names.labels.get(batch.root, batch.query_id)
        for name, value in batch.metrics.figures().items():
            metadata[f"{query}/{name}"] = _figure(
                value if isinstance(value, int) else round(value, 3)
            )
    if len(run) > 1:
        metadata["batch_figures"] = batch_figures(run, names)
    m = recorded.metrics
    return AssetMaterialization(
        state_batch_metrics.key,
        description=(
            f"{label} batch {recorded.batch_id}"
            + (f" and {len(run) - 1} other batches (see batch_figures)" if len(run) > 1 else "")
            + f": {m.rows_in:,} rows in, {m.keys_updated:,} keys updated, "
            f"{size(m.bytes_written)} written, commit {millis(m.commit_ms)}, batch "
            f"{millis(m.extra.get('batch_ms'))}"
        ),
        metadata=metadata,
    )


def batch_entry(event: AssetMaterialization, recorded: RecordedBatchMetrics) -> EventLogEntry:
    """A runless materialization stamped with the time the runtime recorded ``recorded``
    (``report_runless_asset_event`` and a sensor's ``asset_events`` stamp the time of
    reporting, so a tick's batches would share one x on the Plots tab)."""
    return EventLogEntry(  # type: ignore[no-untyped-call]
        user_message="",
        level=logging.INFO,
        job_name=RUNLESS_JOB_NAME,
        run_id=RUNLESS_RUN_ID,
        error_info=None,
        timestamp=recorded.recorded_at.timestamp(),
        dagster_event=DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
            job_name=RUNLESS_JOB_NAME,
            event_specific_data=StepMaterializationData(event),
        ),
    )


def report_batches(instance: DagsterInstance, catalog: Catalog, after: Position) -> Position:
    """Reports the batches recorded after ``after`` (at most ``TICK_BATCHES``), in position
    order, a page of ``PAGE`` at a time, its events (:func:`batch_runs`) in one write; returns
    the last position reported (``after`` when none). The stores' names are read only when
    there is a batch to report: a quiet tick reads the page of new batches alone, whatever
    the fleet."""
    names: StoreNames | None = None
    last, count = after, 0
    while count < TICK_BATCHES:
        limit = min(PAGE, TICK_BATCHES - count)
        page = catalog.batch_metrics_after(last, limit=limit)
        if not page:
            break
        names = names or StoreNames.current(catalog)
        instance.event_log_storage.store_event_batch(
            [batch_entry(batch_run_event(run, names), run[-1][1]) for run in batch_runs(page)]
        )
        last, count = page[-1][0], count + len(page)
        if len(page) < limit:
            break
    return last


class ReportConfig(Config):
    """The catalog runs to report: positions after ``after`` up to ``until`` (at most
    ``RUNS``: the sensor read them). A run requested before the catalog recorded transactions
    names ids (:func:`position`): ``Any``, as Dagster's config takes no union of int and
    list."""

    after: Any = Field(
        description="Report the runs after this position, [xact, id] (or an id: [0, id])..."
    )
    until: Any = Field(description="...up to this one.")


@op(description="Reports maintenance runs from outside Dagster and the stores' state after them.")
def report_catalog_runs(
    context: OpExecutionContext, config: ReportConfig, maintenance: MaintenanceResource
) -> None:
    """Each run's own events, then every store's state, per-store checks and the fleet's
    totals (described by every run outside Dagster since ``after``: the state is read now),
    logged in this Dagster run (its id tells each per-store check evaluation apart:
    Dagster 1.13 keeps one runless evaluation per check and partition only), the stores a
    page at a time. ``log_event`` takes check evaluations too (Dagster 1.13); its annotation
    omits them."""
    policy = maintenance.policy()
    partitions = set(context.instance.get_dynamic_partitions(state_stores.name or ""))
    with maintenance.fleet(f"dagster:{context.run.run_id}") as fleet:
        catalog = fleet.catalog
        # the state is read now, so it holds what every run since recorded, reported or not
        # yet; the runs are read after it, so the description names them
        health = HealthSpool.of(store_report_pages(fleet, policy))
        until = position(config.until)
        runs = [
            r
            for at, r in catalog.runs_after(position(config.after), limit=RUNS)
            if at <= until and not _in_dagster(r)
        ]
        about = described_by(catalog, position(config.after))
        names = StoreNames.of(catalog)
        for run in runs:
            for run_event in run_events(run):
                context.log_event(run_event)  # type: ignore[arg-type]
        context.log_event(fleet_materialization(health.pages(), names, about.runs))
        for changed in changed_store_events(
            context.instance,
            catalog,
            health.pages(),
            names,
            policy,
            partitions,
            PER_STORE,
            about,
        ):
            for event in [*changed.states, *changed.evaluations]:
                context.log_event(event)  # type: ignore[arg-type]
            changed.logged()
        health.close()


@job(
    name="state_catalog_report_job",
    description="Reports maintenance run outside Dagster (requested by state_catalog_events).",
    tags={KIND_TAG: "report"},
    # its resource bound here: Dagster 1.13 rebinds a sensor's job whose resources come from
    # the Definitions, and warns (BetaWarning: owners) on every load of the code location
    resource_defs={"maintenance": MaintenanceResource()},
)
def catalog_report_job() -> None:
    report_catalog_runs()


@sensor(
    name="state_catalog_events",
    job=catalog_report_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Reports maintenance run outside Dagster (CLI, library, Spark) and each batch's "
        "metrics from the catalog as asset events, so the UI is current whoever ran it."
    ),
)
def catalog_events_sensor(
    context: SensorEvaluationContext, maintenance: MaintenanceResource
) -> SensorResult:
    cursor = Cursor.parse(context.cursor)
    partitions = newest_partition(context.instance)
    with maintenance.fleet("dagster:catalog-events") as fleet:
        catalog = fleet.catalog
        if cursor.run is None:  # the first tick: the stores' state now, and the latest checks
            recent = catalog.runs_after(Position(), limit=RUNS, newest=True)
            until = recent[-1][0] if recent else Position()
            validated = [at for at, r in recent if r.kind == RunKind.VALIDATE.value]
            after = Position(validated[-1].xact, validated[-1].row - 1) if validated else until
            new = True
        else:
            outside, last = finished_outside(catalog.runs_after(cursor.run, limit=RUNS))
            after, until = cursor.run, cursor.run if last is None else last
            new = bool(outside) or partitions != cursor.partitions
        held = max(cursor.metrics, reported_through(context.instance))
        reported = report_batches(context.instance, catalog, held)
        quiet = reported == held and not new
        waiting = catalog.unsettled(held, until) if quiet else Unsettled()
    next_cursor = Cursor(until, reported, partitions).text()
    requests = []
    if new:
        config = ReportConfig(after=pair(after), until=pair(until))
        span = f"{after.xact}.{after.row}-{until.xact}.{until.row}"
        requests.append(
            RunRequest(
                run_key=f"catalog-runs-{span}-{partitions}",
                run_config=RunConfig(ops={"report_catalog_runs": config}),
            )
        )
    if quiet:
        skip = SkipReason(f"nothing new in the catalog after run {until.row}{stalled(waiting)}")
        return SensorResult(skip_reason=skip, cursor=next_cursor)
    return SensorResult(run_requests=requests, cursor=next_cursor)
