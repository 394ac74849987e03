"""Operators: one maintenance pass of ``state_runtime.maintenance`` each, as the CLI runs it.

Each opens the catalog and storage through
:class:`~state_runtime_airflow.hooks.StateCatalogHook` (Airflow connections), takes the policy
from the worker's ``STATE_MAINTENANCE_*`` environment with the task's ``policy`` settings over
it, works on ``checkpoint_roots`` (default: every root in the catalog) or the ``stores``
named, and records its run in the catalog like any maintenance run (owner
``airflow:<dag>.<task>[<map index>]/<run id>``). Its XCom value and its log give the outcome
per store in words (:mod:`state_runtime_airflow.results`). What deletes or rewrites (cleanup,
repair, restore, repartition) is a dry run unless ``dry_run=False``. A task fails, naming
the stores, when a store's pass failed, a blocking check failed or a store is broken; an
error of ours (a refusal, the catalog down, Spark's wrappers included) fails it with the one
paragraph ``statestore`` prints, its full trace in the library's log file
(:mod:`state_runtime.failures`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from state_runtime.catalog import StoreKey
from state_runtime.failures import quiet_warnings, reported
from state_runtime.maintenance import (
    CHECKS,
    CallbackProgress,
    Fleet,
    MaintenancePolicy,
    SnapshotStatus,
    StoreStatus,
    cleanup_pass,
    due_for_snapshot,
    parse_store_key,
    plan_restore,
    rebuild_plan,
    repair_pass,
    restore_query,
    run_checks,
    snapshot_pass,
    store_reports,
)
from state_runtime_airflow.hooks import DEFAULT_CATALOG_CONN, DEFAULT_STORAGE_CONN, StateCatalogHook
from state_runtime_airflow.results import (
    Result,
    checks_result,
    cleanup_result,
    failure,
    health_result,
    log_lines,
    rebuild_result,
    repair_result,
    repartition_result,
    restore_result,
    snapshot_result,
)
from state_runtime_airflow.store_assets import MAINTAINED, root_asset

SCOPE_TEMPLATE = "{{ state_scope }}"
"""The ``map_index_template`` of a mapped maintenance task: the roots or stores it covers."""


@dataclass(frozen=True)
class Work:
    """What one task maintains: the stores (``only`` narrows them), the policy, progress."""

    fleet: Fleet
    policy: MaintenancePolicy
    only: list[StoreKey] | None
    progress: CallbackProgress


def owner_of(context: Context) -> str:
    """Who runs the pass, in the catalog's run records and leases."""
    ti = context["ti"]
    index = "" if ti.map_index is None or ti.map_index < 0 else f"[{ti.map_index}]"
    return f"airflow:{ti.dag_id}.{ti.task_id}{index}/{ti.run_id}"


def _as_list(value: str | Sequence[str] | None, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value] if value else None
    if not all(isinstance(v, str) for v in value):
        raise AirflowException(f"{name} must be a string or a list of strings, got {value!r}")
    return list(value) or None


def _as_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise AirflowException(f"{name} must be true or false, got {value!r}")
    return value


class StateMaintenanceOperator(BaseOperator):
    """The shared part of the maintenance operators (see the module docstring).

    :param checkpoint_roots: checkpoint roots (paths or URIs) to maintain; default every root.
    :param stores: only these stores (``<root>#<operator>/<partition>/<store name>``).
    :param policy: maintenance settings over the environment's (``{"window": "2d"}``).
    :param workers: stores worked on in parallel (snapshots, validation, cleanup); the
        policy's ``workers`` setting, given here (default: as many as the host and the
        catalog's pool allow).
    :param processes: worker processes on this host the passes deal their stores to; the
        policy's ``processes`` setting, given here (default: one per CPU for a large pass on
        a PostgreSQL catalog, else threads; 1: threads; N: N processes on PostgreSQL).
    """

    template_fields: Sequence[str] = ("checkpoint_roots", "stores", "policy")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        checkpoint_roots: str | Sequence[str] | None = None,
        stores: Sequence[str] | None = None,
        policy: Mapping[str, object] | None = None,
        workers: int | None = None,
        processes: int | None = None,
        state_catalog_conn_id: str = DEFAULT_CATALOG_CONN,
        storage_conn_id: str | None = DEFAULT_STORAGE_CONN,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("map_index_template", SCOPE_TEMPLATE)
        super().__init__(**kwargs)
        self.checkpoint_roots = checkpoint_roots
        self.stores = stores
        self.policy = policy
        self.workers = workers
        self.processes = processes
        self.state_catalog_conn_id = state_catalog_conn_id
        self.storage_conn_id = storage_conn_id

    def hook(self) -> StateCatalogHook:
        return StateCatalogHook(self.state_catalog_conn_id, self.storage_conn_id)

    @contextmanager
    def work(self, context: Context) -> Iterator[Work]:
        """The policy first (a bad setting opens nothing), then the catalog and storage; our
        error raised meanwhile fails the task with its one paragraph."""
        try:
            settings = dict(self.policy or {})
            for name in ("workers", "processes"):
                if getattr(self, name) is not None:
                    settings[name] = getattr(self, name)
            policy = MaintenancePolicy.from_env().with_settings(
                settings, f"task {self.task_id} policy"
            )
            stores = _as_list(self.stores, "stores")
            only = [parse_store_key(s) for s in stores] if stores else None
            roots = _as_list(self.checkpoint_roots, "checkpoint_roots")
            context["state_scope"] = ", ".join(stores or roots or ["every root"])  # type: ignore[typeddict-unknown-key]
            progress = CallbackProgress(
                lambda what, done, total: self.log.info("%s: %d/%d", what, done, total)
            )
            # pyspark's warnings, for the tasks that start Spark (repartition)
            with self.hook().fleet(owner_of(context), roots) as fleet, quiet_warnings():
                yield Work(fleet, policy, only, progress)
        except AirflowException:
            raise
        except Exception as exc:
            found = reported(exc)
            if found is None:
                raise
            raise AirflowException(found[1]) from None

    def report(self, context: Context, found: Result, failure: str | None = None) -> Result:
        """Log ``found`` per store and return it as the XCom value; with ``failure``, push
        it all the same and fail the task with that message."""
        for line in log_lines(found):
            self.log.info("%s", line)
        if failure is not None:
            context["ti"].xcom_push("return_value", found)
            raise AirflowException(failure)
        return found


class StateSnapshotOperator(StateMaintenanceOperator):
    """Snapshots every store in scope whose delta chain passed the threshold (verified before
    they replace deltas); fails naming each store whose snapshot failed."""

    def execute(self, context: Context) -> Result:
        with self.work(context) as work:
            report = snapshot_pass(
                work.fleet,
                work.policy,
                only=work.only,
                progress=work.progress,
            )
        failed = [row for row in report.rows() if row["status"] == SnapshotStatus.FAILED]
        return self.report(context, snapshot_result(report), failure("snapshot", failed))


class StateValidationOperator(StateMaintenanceOperator):
    """Validates the stores in scope and evaluates the platform's checks (one recorded
    'validate' run); fails when a blocking check (``lineage_valid``) fails, naming the
    stores, so that a cleanup downstream of it does not run."""

    def execute(self, context: Context) -> Result:
        with self.work(context) as work:
            report = run_checks(
                work.fleet,
                work.policy,
                only=work.only,
                progress=work.progress,
            )
        blocking = {c.name for c in CHECKS if c.blocking}
        failed = [o for o in report.outcomes if o.name in blocking and not o.passed]
        for outcome in report.outcomes:
            if not outcome.passed:
                self.log.warning("check %s failed: %s", outcome.name.value, outcome.summary)
        message = "; ".join(
            f"{o.name.value} failed for {', '.join(sorted({str(f.key) for f in o.findings}))}: "
            f"{o.summary}"
            for o in failed
        )
        return self.report(context, checks_result(report), message or None)


class StateWritingOperator(StateMaintenanceOperator):
    """The shared part of the operators whose pass rewrites or deletes: a dry run (the plan)
    unless ``dry_run=False``.

    :param dry_run: only plan the pass (the default); false carries it out. Kept as
        ``dry_run_setting`` (rendered there from a template): ``dry_run`` is Airflow's own
        method of every operator.
    """

    template_fields: Sequence[str] = (
        *StateMaintenanceOperator.template_fields,
        "dry_run_setting",
    )

    def __init__(self, *, dry_run: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run_setting = dry_run

    def plans_only(self) -> bool:
        """Whether this run only plans (``dry_run`` as rendered)."""
        return _as_bool(self.dry_run_setting, "dry_run")


class StateQueryOperator(StateWritingOperator):
    """The shared part of the operators that work on one stopped query below one root.

    :param root: the query's checkpoint root.
    :param query_id: the query.
    :param spark_checkpoint: the query's Spark checkpoint folder (``""``: none).
    """

    template_fields: Sequence[str] = (
        *StateWritingOperator.template_fields,
        "query_id",
        "spark_checkpoint",
    )

    def __init__(
        self, *, root: str, query_id: str, spark_checkpoint: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(checkpoint_roots=root, **kwargs)
        self.query_id = query_id
        self.spark_checkpoint = spark_checkpoint


class StateCleanupOperator(StateWritingOperator):
    """Deletes what retention allows, each deletion recorded with its reason; a dry run
    (the plan, per store) unless ``dry_run=False``. Stores with open problems are held."""

    def execute(self, context: Context) -> Result:
        dry_run = self.plans_only()
        with self.work(context) as work:
            report = cleanup_pass(
                work.fleet, work.policy, dry_run=dry_run, only=work.only, progress=work.progress
            )
        failed = "; ".join(f"{path}: {error}" for path, error in report.failed.items())
        return self.report(
            context,
            cleanup_result(report),
            f"could not delete {len(report.failed)} file(s): {failed}" if failed else None,
        )


class StateRepairOperator(StateWritingOperator):
    """Rebuilds damaged snapshots from their intact deltas; a dry run (the damaged snapshots)
    unless ``dry_run=False``. Fails naming each snapshot it could not repair."""

    def execute(self, context: Context) -> Result:
        dry_run = self.plans_only()
        with self.work(context) as work:
            if dry_run:
                return self.report(
                    context, rebuild_result(rebuild_plan(work.fleet, work.policy, work.only))
                )
            report = repair_pass(work.fleet, work.policy, only=work.only, progress=work.progress)
        bad = {o.status for o in report.failed}
        failed = [row for row in report.rows() if row["status"] in bad]
        return self.report(context, repair_result(report), failure("repair", failed))


class StateRestoreOperator(StateQueryOperator):
    """Returns a stopped query's stores (below one root) to an earlier, intact batch; a dry
    run (the plan: each store's version, what is superseded) unless ``dry_run=False``.

    :param batch_id: the batch to return to.
    :param allow_lost_state: accept that stores whose version does not load start again empty.
    """

    template_fields: Sequence[str] = (
        *StateQueryOperator.template_fields,
        "batch_id",
        "allow_lost_state",
    )

    def __init__(
        self, *, batch_id: int | str, allow_lost_state: bool | str = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.batch_id = batch_id
        self.allow_lost_state = allow_lost_state

    def execute(self, context: Context) -> Result:
        dry_run = self.plans_only()
        with self.work(context) as work:
            [root] = work.fleet.root_names()
            plan = plan_restore(
                work.fleet,
                root,
                self.query_id,
                int(self.batch_id),
                spark_checkpoint=self.spark_checkpoint,
                allow_lost_state=_as_bool(self.allow_lost_state, "allow_lost_state"),
            )
            if not dry_run:
                plan = restore_query(work.fleet, plan, work.policy)
        return self.report(context, restore_result(plan))


class StateRepartitionOperator(StateQueryOperator):
    """Changes a stopped query's number of state partitions (``statestore repartition``): a
    Spark job routes every key with the runtime's rule and writes one snapshot per new
    partition, and one catalog transaction switches the layout. A dry run (rows and bytes per
    new partition, the skew) unless ``dry_run=False``. Its ``spark_checkpoint``'s last
    committed batch must be the catalog's.

    :param num_partitions: the new number of state partitions.
    :param operator_id: only this operator (default: every operator of the query).
    :param master: the Spark master of the job (``SPARK_REMOTE``, when set, makes the session
        a Spark Connect client).
    :param idle_seconds: refuse while the query committed a batch this recently (it may run).
    """

    template_fields: Sequence[str] = (
        *StateQueryOperator.template_fields,
        "num_partitions",
        "operator_id",
        "master",
        "idle_seconds",
    )

    def __init__(
        self,
        *,
        num_partitions: int | str,
        operator_id: int | str | None = None,
        master: str = "local[2]",
        idle_seconds: int | str = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_partitions = num_partitions
        self.operator_id = operator_id
        self.master = master
        self.idle_seconds = idle_seconds

    def execute(self, context: Context) -> Result:
        from state_runtime.maintenance.repartition import repartition
        from state_runtime.runtime.spark_session import spark_session

        dry_run = self.plans_only()
        operator = None if self.operator_id in (None, "") else int(str(self.operator_id))
        with self.work(context) as work:
            [root] = work.fleet.root_names()
            plan = repartition(
                lambda: spark_session(self.master, app_name=f"airflow-{self.task_id}"),
                work.fleet,
                root,
                self.query_id,
                int(str(self.num_partitions)),
                operator_id=operator,
                spark_checkpoint=self.spark_checkpoint,
                dry_run=dry_run,
                policy=work.policy,
                idle=timedelta(seconds=int(str(self.idle_seconds))),
                progress=work.progress,
            )
        return self.report(context, repartition_result(plan))


class StateHealthCheckOperator(StateMaintenanceOperator):
    """Each store's status from the catalog (healthy, degraded, broken, unknown); fails naming
    every broken store and why. When no store is broken, records an event on the asset of
    each root in scope (through the ``state_runtime_maintained`` alias, which this task must
    have among its outlets): downstream DAGs scheduled on :func:`root_asset` run then."""

    def execute(self, context: Context) -> Result:
        with self.work(context) as work:
            reports = store_reports(work.fleet, work.policy, only=work.only)
            roots = work.fleet.root_names(work.only)
        found = health_result(reports)
        broken = [r for r in reports if r.status.status is StoreStatus.BROKEN]
        if broken:
            names = "; ".join(f"{r.key}: {r.status}" for r in broken)
            return self.report(context, found, f"{len(broken)} broken store(s): {names}")
        if any(outlet == MAINTAINED for outlet in self.outlets):
            for root in roots:
                stores = [r for r in reports if r.key.root == root]
                context["outlet_events"][MAINTAINED].add(
                    root_asset(root),
                    extra={
                        "stores": len(stores),
                        "statuses": ", ".join(sorted({r.status.status.value for r in stores})),
                    },
                )
        return self.report(context, found)


class StateDueStoresOperator(StateMaintenanceOperator):
    """The stores due for a snapshot (from the catalog alone), in groups of at most
    ``stores_per_task``: what the maintenance DAG maps its snapshot task over."""

    template_fields: Sequence[str] = (*StateMaintenanceOperator.template_fields, "stores_per_task")

    def __init__(self, *, stores_per_task: int | str = 200, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stores_per_task = stores_per_task

    def execute(self, context: Context) -> list[list[str]]:
        size = int(self.stores_per_task)
        if size < 1:
            raise AirflowException(f"stores_per_task must be at least 1, got {size}")
        with self.work(context) as work:
            due = due_for_snapshot(work.fleet, work.policy, work.only)
        keys = sorted(str(d.record.key) for d in due)
        groups = [keys[i : i + size] for i in range(0, len(keys), size)]
        self.log.info("%d store(s) due for a snapshot, in %d group(s)", len(keys), len(groups))
        for key in keys:
            self.log.info("  %s", key)
        return groups


class StateRootsOperator(StateMaintenanceOperator):
    """The checkpoint roots in scope: what the maintenance DAG maps its per-root validation,
    cleanup and health over."""

    def execute(self, context: Context) -> list[str]:
        with self.work(context) as work:
            roots = work.fleet.root_names(work.only)
        self.log.info("%d root(s): %s", len(roots), ", ".join(roots))
        return roots
