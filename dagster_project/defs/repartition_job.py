"""The repartition job: change a stopped query's number of state partitions from Dagster.

Launched by hand only (no schedule, no sensor) and a dry run unless ``dry_run`` is false, like
every writer of this code location; the work is the library's
(:func:`state_runtime.maintenance.repartition.repartition`), run on a Spark session the op
starts (``spark_master``, or a Spark Connect server when ``SPARK_REMOTE`` is set). The
repartition then shows on each store's ``state_checkpoints`` partition through the health
asset's ``layout`` metadata.
"""

from datetime import timedelta

from dagster import Config, OpExecutionContext, Output, job, op
from pydantic import Field

from dagster_project.defs.metadata import repartition_metadata
from dagster_project.defs.resources import MaintenanceResource
from state_runtime.failures import quiet_warnings
from state_runtime.maintenance.progress import CallbackProgress
from state_runtime.maintenance.repartition import repartition
from state_runtime.runtime.spark_session import spark_session


class RepartitionConfig(Config):
    """What to repartition; ``dry_run=True`` (default) routes the keys and reports only."""

    root: str = Field(description="The query's checkpoint root.")
    query_id: str = Field(description="The query to repartition (stopped).")
    partitions: int = Field(description="The new number of state partitions.", ge=1)
    operator_id: int | None = Field(default=None, description="Only this operator.")
    spark_checkpoint: str = Field(
        default="",
        description="The query's Spark checkpoint folder ('' if it runs without one).",
    )
    idle_seconds: int = Field(default=60, ge=0, description="Refuse if a batch committed since.")
    spark_master: str = Field(default="local[2]", description="Spark master for the job.")
    dry_run: bool = Field(default=True, description="Route the keys and report; switch nothing.")


@op(tags={"state_runtime/maintenance": "repartition"})
def state_repartition(
    context: OpExecutionContext, config: RepartitionConfig, maintenance: MaintenanceResource
) -> Output[dict[str, int]]:
    """Plan, estimate or carry out a repartition (see the module)."""
    log = context.log
    progress = CallbackProgress(lambda what, done, total: log.info(f"{what}: {done}/{total}"))
    with maintenance.fleet(f"dagster:{context.run.run_id}") as fleet, quiet_warnings():
        plan = repartition(
            lambda: spark_session(config.spark_master, app_name="dagster-repartition"),
            fleet,
            config.root,
            config.query_id,
            config.partitions,
            operator_id=config.operator_id,
            spark_checkpoint=config.spark_checkpoint,
            dry_run=config.dry_run,
            policy=maintenance.policy(),
            idle=timedelta(seconds=config.idle_seconds),
            progress=progress,
        )
    return Output(plan.counts(), metadata=repartition_metadata(plan))


@job(tags={"state_runtime/maintenance": "repartition"})
def state_repartition_job() -> None:
    """Change a stopped query's number of state partitions (dry run unless configured)."""
    state_repartition()
