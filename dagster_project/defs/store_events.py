"""The events that tell Dagster what the catalog knows about each store, whoever asked.

One set of events for every path: a validation run in Dagster (the checks' step logs them,
so a failing blocking check cannot hide them), the health asset run alone, and maintenance run
outside Dagster (the catalog sensor reports them without a run). For each store, its state on
its ``state_checkpoints`` partition (status, figures, schema history) and its per-store check
evaluations; for the fleet, a materialization of ``state_store_health`` (totals, a table of
the stores).

A sound store's state is a materialization of its partition; a broken store's is an
observation, and its partition shows *Failed*. Dagster 1.13 marks a partition failed only when
a run that targeted it ends failed without materializing it (no event reports a failure: the
partition status cache reads the planned materializations of failed runs), so the failure is
such a run: ``record_store_state``, the executable ``state_checkpoints``, records one store's
state from the catalog (for a broken store an observation, logged before it fails: the
partition's page shows the status and reason as its latest metadata, over its last sound
materialization) and fails for a broken store. The ``state_store_failures`` sensor requests it
for each broken store whose partition does not show *Failed* yet, whoever validated, and again
for each partition it failed once the store is no longer broken (:func:`partition_runs`): that
run materializes the partition, so the page's latest run is a success and its red "Run …
failed" banner goes (a validation's materialization clears *Failed* but not the banner, which
names the partition's latest run). An observation never clears *Failed*.

A partitioned check's page shows the latest evaluation as the check's state, so the
evaluations of one pass come healthy first and the worst store last: the check's headline is
the worst store, never a healthy one that happened to be evaluated after it.

Events follow changes, not the fleet's size (:func:`changed_store_events`): a pass reports a
store's state only when its status or open problems changed since the last report (not its
latest version or snapshot, which move for every store that commits: :func:`state_fingerprint`);
a per-store check only when its result (passed, severity) changed, plus the worst store's
evaluation, last, in every pass (the check's latest execution is its headline: a pass that
evaluated none would show it *skipped*); the fleet's figures (its totals, the stores' table
with each latest version) are one event per pass whatever its size. What was last reported
is kept in the Dagster instance's key-value store, one key per query label and kind of event
(``state_runtime/reported/<kind>/<label>``), and saved once the events are logged: a pass
that failed before that reports again. A store's own run (``record_store_state``) records
its state whatever was reported (what a pass reported last need not be the partition's latest
event: the store may have been repaired and broken again since, recorded by such runs only);
when the partition's latest event shows that very state and names a validation (a report's of
a validation from the CLI: its ``validated_by`` metadata, ``validate run N by <owner>``), its
event names it too, so who validated survives whichever logs last, the run that fails a broken
store's partition or the one that records it again once sound. Carried as metadata, never
parsed back from a description: an owner may hold any text.
"""

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetPartitionStatus,
    AssetRecordsFilter,
    DagsterInstance,
    Failure,
    MetadataValue,
    multi_asset,
)

from dagster_project.defs.checkpoints import state_checkpoints
from dagster_project.defs.metadata import (
    MetadataMap,
    check_metadata,
    layout_metadata,
    longest_chains,
    schema_metadata,
    status_metadata,
    store_figures,
    store_table,
    totals_metadata,
)
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.catalog import Catalog, Layout
from state_runtime.maintenance import (
    CHECKS,
    CheckOutcome,
    FleetTotals,
    MaintenancePolicy,
    SchemaChangeRow,
    Severity,
    StoreNames,
    StoreReport,
    StoreStatus,
    schema_changes,
    store_reports,
)
from state_runtime.units import age, size

HEALTH_KEY = AssetKey("state_store_health")
REPORTED = "state_runtime/reported"
VALIDATED_BY = "validated_by"  # a report's states: the validation it names (``Reported``)
StateEvent = AssetMaterialization | AssetObservation  # a store's state on its partition
BLOCKING = {check.name for check in CHECKS if check.blocking}
WORST_LAST = {
    StoreStatus.HEALTHY: 0,
    StoreStatus.UNKNOWN: 1,
    StoreStatus.DEGRADED: 2,
    StoreStatus.BROKEN: 3,
}


def severity(value: Severity) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if value is Severity.ERROR else AssetCheckSeverity.WARN


def worst_last(reports: Sequence[StoreReport]) -> list[StoreReport]:
    return sorted(reports, key=lambda r: (WORST_LAST[r.status.status], str(r.key)))


def summary(report: StoreReport) -> str:
    """One line a person reads first: status since when and why (as the ``store_status``
    check's evaluation says it), size and the last commit."""
    h = report.health
    lag = "nothing committed" if h.commit_lag is None else f"last commit {age(h.commit_lag)} ago"
    return (
        f"{report.status} · version {h.latest.version}, "
        f"{size(h.live_bytes)} live in {h.live_files} files · {lag}"
    )


@dataclass(frozen=True)
class Reported:
    """What a report's events follow: ``runs``, the runs outside Dagster it names (its events'
    descriptions start with them), and ``validation``, the newest validation among them
    (``validate run N by <owner>``; empty: none), kept on its states as ``validated_by``
    metadata for :func:`naming_validation` to carry. A pass in Dagster names none, and says so:
    every state has the key, so a later one's value replaces an earlier one's on the
    partition's page."""

    runs: str = ""
    validation: str = ""

    def prefix(self) -> str:
        return f"{self.runs}: " if self.runs else ""

    def metadata(self) -> MetadataMap:
        return {VALIDATED_BY: MetadataValue.text(self.validation)}


def store_states(
    catalog: Catalog,
    reports: Sequence[StoreReport],
    names: StoreNames,
    partitions: Collection[str],
    reported: Reported = Reported(),
) -> list[StateEvent]:
    """Each store's state on its partition (stores without a partition yet are skipped: the
    discovery sensor adds it, and the next pass records it), with its operator's schema
    history and partition layouts (repartitions) and what it was ``reported`` after: a
    materialization, or an observation for a broken store (its partition shows *Failed*, see
    the module's docstring)."""
    roots = sorted({r.key.root for r in reports})
    schemas: dict[tuple[str, int, str], list[SchemaChangeRow]] = {}
    for change in schema_changes(catalog, roots):
        schemas.setdefault((change.root, change.operator_id, change.store_name), []).append(change)
    layouts: dict[tuple[str, int, str], list[Layout]] = {}
    for root in roots:
        for layout in catalog.layout_history(root):
            layouts.setdefault((layout.root, layout.operator_id, layout.store_name), []).append(
                layout
            )
    events: list[StateEvent] = []
    for report in worst_last(reports):
        name = names.name(report.key)
        if name not in partitions:
            continue
        store = report.key.store
        operator = (report.key.root, store.operator_id, store.store_name)
        kind = (
            AssetObservation if report.status.status is StoreStatus.BROKEN else AssetMaterialization
        )
        events.append(
            kind(
                state_checkpoints.key,
                partition=name,
                description=reported.prefix() + summary(report),
                metadata=store_figures(report, names)
                | schema_metadata(schemas.get(operator, []))
                | layout_metadata(layouts.get(operator, []))
                | reported.metadata(),
            )
        )
    return events


# skippable: its materialization is an event of its own (an output's has no description)
@multi_asset(specs=[state_checkpoints.replace_attributes(skippable=True)])
def record_store_state(
    context: AssetExecutionContext, maintenance: MaintenanceResource
) -> Iterator[AssetMaterialization]:
    """Records one store's state from the catalog on its partition (it reads, never writes):
    materialized with its status and figures, or for a broken store observed with them, then
    failed with its reason; either naming the validation its partition's latest event names
    for that state (:func:`naming_validation`)."""
    name = context.partition_key
    with maintenance.run(context) as run:
        reports = store_reports(run.fleet, run.policy, only=[run.names.key(name)])
        events = store_states(run.fleet.catalog, reports, run.names, {name})
    if not events:
        raise Failure(description=f"no store {name} in the catalog")
    [recorded] = events
    event = naming_validation(context.instance, name, recorded)
    if isinstance(event, AssetObservation):
        context.log_event(event)  # the partition's latest metadata: its status and reason
        raise Failure(description=event.description, metadata=event.metadata)
    yield event


def naming_validation(instance: DagsterInstance, name: str, event: StateEvent) -> StateEvent:
    """A store's state on partition ``name``, naming the validation the partition's latest
    event names (its ``validated_by`` metadata, carried) when that one shows the same state
    (status and reason): a state recorded after the report's must not hide who validated. Two
    reads of one event each, whatever the fleet's size."""
    records = [
        fetch(AssetRecordsFilter(event.asset_key, asset_partitions=[name]), limit=1)
        for fetch in (instance.fetch_materializations, instance.fetch_observations)
    ]
    found = [r for page in records for r in page.records]
    before = max(found, key=lambda r: r.storage_id).asset_event if found else None
    if before is None or not _same_state(before, event):
        return event
    validated = before.metadata.get(VALIDATED_BY)
    if validated is None or not validated.value:
        return event
    return type(event)(
        event.asset_key,
        partition=name,
        description=f"{validated.value}: {event.description}",
        metadata={**event.metadata, VALIDATED_BY: validated},
    )


def _same_state(before: StateEvent, now: StateEvent) -> bool:
    return all(
        before.metadata.get(key) == now.metadata.get(key) for key in ("status", "status_reason")
    )


@dataclass(frozen=True)
class PartitionRuns:
    """The ``record_store_state`` runs the partitions need: ``fail`` the broken stores'
    partitions that show neither *Failed* nor a run in progress; ``clear`` the partitions failed
    before (shown *Failed*, or in the sensor's list) whose store is no longer broken;
    ``failed`` the partitions of the stores broken now (the sensor's list for its next tick)."""

    fail: list[tuple[str, StoreReport]]
    clear: list[tuple[str, StoreReport]]
    failed: list[str]


def partition_runs(
    reports: Sequence[StoreReport],
    names: StoreNames,
    statuses: Mapping[str, AssetPartitionStatus | None],
    failed_before: Collection[str],
) -> PartitionRuns:
    """What each store's partition needs, from the catalog's status and Dagster's."""
    named = sorted(
        ((names.name(r.key), r) for r in reports if names.name(r.key) in statuses),
        key=lambda found: found[0],
    )
    settled = {AssetPartitionStatus.FAILED, AssetPartitionStatus.IN_PROGRESS}
    broken = [(n, r) for n, r in named if r.status.status is StoreStatus.BROKEN]
    was_failed = set(failed_before) | {
        n for n, s in statuses.items() if s is AssetPartitionStatus.FAILED
    }
    return PartitionRuns(
        fail=[(n, r) for n, r in broken if statuses[n] not in settled],
        clear=[
            (n, r)
            for n, r in named
            if n in was_failed
            and r.status.status is not StoreStatus.BROKEN
            and statuses[n] is not AssetPartitionStatus.IN_PROGRESS
        ],
        failed=[n for n, _ in broken],
    )


def fleet_materialization(
    pages: Iterable[Sequence[StoreReport]], names: StoreNames, description: str = ""
) -> AssetMaterialization:
    """The fleet's totals and table as a materialization of ``state_store_health``."""
    return AssetMaterialization(
        HEALTH_KEY, description=description or None, metadata=fleet_metadata(pages, names)
    )


def fleet_metadata(pages: Iterable[Sequence[StoreReport]], names: StoreNames) -> MetadataMap:
    """The fleet's totals and its table (the longest chains), from its stores' reports a page
    at a time: what is held is a page and the table's rows, whatever the fleet's size."""
    totals, table = FleetTotals.of(()), list[StoreReport]()
    for page in pages:
        for report in page:
            totals = totals.plus(report)
        table = longest_chains([*table, *page])
    return {**totals_metadata(totals), "stores_table": store_table(table, names)}


def store_evaluations(
    reports: Sequence[StoreReport],
    names: StoreNames,
    policy: MaintenancePolicy,
    partitions: Collection[str],
    selected: Collection[str],
    reported: Reported = Reported(),
) -> list[AssetCheckEvaluation]:
    """The per-store checks (those ``selected``) on each store's partition, worst last."""
    evaluations = []
    for check in CHECKS:
        if check.judge is None or check.name.value not in selected:
            continue
        for report in worst_last(reports):
            name = names.name(report.key)
            if name not in partitions:
                continue
            verdict = check.judge(report, policy)
            evaluations.append(
                AssetCheckEvaluation(
                    asset_key=state_checkpoints.key,
                    check_name=check.name.value,
                    partition=name,
                    passed=verdict.passed,
                    severity=severity(verdict.severity),
                    description=reported.prefix() + verdict.summary,
                    metadata=status_metadata(report, names),
                )
            )
    return evaluations


def fleet_evaluation(
    outcome: CheckOutcome, names: StoreNames, description: str = ""
) -> AssetCheckEvaluation:
    """A fleet-wide check's evaluation. An evaluation, not an AssetCheckResult: a result
    looks up the target's latest materialization, which fails in an unpartitioned run once
    the stores' partitions have materializations (Dagster 1.13); blocking is carried by the
    evaluation itself."""
    return AssetCheckEvaluation(
        asset_key=state_checkpoints.key,
        check_name=outcome.name.value,
        passed=outcome.passed,
        severity=severity(outcome.severity),
        description=description + outcome.summary,
        metadata=check_metadata(outcome, names),
        blocking=outcome.name in BLOCKING,
    )


def state_fingerprint(report: StoreReport) -> str:
    """What a store's reported state must follow: its status and open problems. Not its
    latest version or last snapshot, which move for every store that commits (at 100,000
    stores committing every minute, a snapshot each ten deltas: every store every hour); a
    snapshot the operator must see is one overdue, and that is the status (*degraded*), a
    stream that stopped is the ``commit_lag`` check's change (docs/maintenance.md)."""
    h = report.health
    return json.dumps([report.status.status.value, h.open_problems, h.first_problem])


@dataclass
class LastReported:
    """What was last reported of one ``kind`` for each partition, in the instance's key-value
    store (one key per query label); :meth:`save` once the events are logged."""

    instance: DagsterInstance
    kind: str
    pending: dict[str, dict[str, str]] = field(default_factory=dict)

    def changed(self, fingerprints: Mapping[str, str]) -> set[str]:
        """The partitions whose fingerprint differs from the last one reported (of a page of
        stores: the other partitions of their query labels keep theirs)."""
        by_key: dict[str, dict[str, str]] = {}
        for name, value in fingerprints.items():
            label = name.rsplit("/", 3)[0]
            by_key.setdefault(f"{REPORTED}/{self.kind}/{label}", {})[name] = value
        stored = self.instance.run_storage.get_cursor_values(set(by_key))
        changed: set[str] = set()
        self.pending = {}
        for key, found in by_key.items():
            before: dict[str, str] = json.loads(stored[key]) if key in stored else {}
            changed |= {name for name, value in found.items() if before.get(name) != value}
            self.pending[key] = before | found
        return changed

    def save(self) -> None:
        if self.pending:
            values = {key: json.dumps(found) for key, found in self.pending.items()}
            self.instance.run_storage.set_cursor_values(values)


@dataclass
class StoreEvents:
    """The per-store events of one page of stores that tell Dagster something new;
    :meth:`logged` once they are logged."""

    states: list[StateEvent]
    evaluations: list[AssetCheckEvaluation]
    trackers: list[LastReported] = field(default_factory=list)

    def logged(self) -> None:
        for tracker in self.trackers:
            tracker.save()


@dataclass
class _Worst:
    """A per-store check's worst evaluation so far in a pass, held back to be its last."""

    rank: tuple[int, str]
    evaluation: AssetCheckEvaluation
    changed: bool


def changed_store_events(
    instance: DagsterInstance,
    catalog: Catalog,
    pages: Iterable[Sequence[StoreReport]],
    names: StoreNames,
    policy: MaintenancePolicy,
    partitions: Collection[str],
    selected: Collection[str] = (),
    reported: Reported = Reported(),
) -> Iterator[StoreEvents]:
    """For each page of stores, each store's state whose fingerprint changed and each
    ``selected`` per-store check whose result changed since the last report; then, last,
    each check's evaluation of the pass's worst store (module docstring), whether or not it
    changed. The caller logs each page's events, then calls :meth:`StoreEvents.logged`: what
    is held is a page's events, whatever the fleet's size."""
    checks = [c.name.value for c in CHECKS if c.judge is not None and c.name.value in selected]
    worst: dict[str, _Worst] = {}
    for page in pages:
        named = {names.name(r.key): r for r in page if names.name(r.key) in partitions}
        if not named:
            continue
        states = LastReported(instance, "state")
        fresh = states.changed({name: state_fingerprint(r) for name, r in named.items()})
        events = store_states(
            catalog, [r for n, r in named.items() if n in fresh], names, partitions, reported
        )
        worst_here = worst_last(list(named.values()))[-1]
        rank = (WORST_LAST[worst_here.status.status], str(worst_here.key))
        trackers, evaluations = [states], list[AssetCheckEvaluation]()
        for check in checks:
            found = store_evaluations(page, names, policy, partitions, {check}, reported)
            tracker = LastReported(instance, f"check/{check}")
            changed = tracker.changed({e.partition or "": _result(e) for e in found})
            held = worst.get(check)
            if held is None or rank > held.rank:  # this page's worst is the pass's worst
                if held is not None and held.changed:
                    evaluations.append(held.evaluation)
                worst[check] = _Worst(rank, found[-1], found[-1].partition in changed)
                found = found[:-1]
            evaluations += [e for e in found if e.partition in changed]
            trackers.append(tracker)
        yield StoreEvents(events, evaluations, trackers)
    if worst:
        yield StoreEvents([], [held.evaluation for held in worst.values()])


def _result(evaluation: AssetCheckEvaluation) -> str:
    return f"{evaluation.passed}/{evaluation.severity.value}"
